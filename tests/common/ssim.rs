//! The structural similarity of two images of the same size (Wang et al.,
//! 2004), for the thumbnail's differential test against libvips and for
//! `bench/thumbnail.sh` (through `examples/ssim.rs`).
//!
//! An 11×11 Gaussian window (σ = 1.5), K1 = 0.01, K2 = 0.03, L = 255, on
//! 8-bit values as stored; windows that would leave the image are skipped.
//! These are the paper's constants, so figures compare with other tools'
//! SSIM. An image narrower or lower than the window is compared as one
//! window of its own size with uniform weights (a 1×1 thumbnail still gets
//! a score). 1 means identical; JPEG thumbnails at quality 80–90 score
//! about 0.95–0.99.
//!
//! Written here rather than taken from a crate: the maintained SSIM crates
//! are AGPL (dssim) or bring their own image pipelines, and ImageMagick 6
//! (Debian's) has no SSIM metric.
// Its two users take different parts: the example luma, the test channels.
#![allow(dead_code)]

/// One channel of an image as f64 samples, row by row.
pub struct Plane {
    pub width: usize,
    pub height: usize,
    pub samples: Vec<f64>,
}

impl Plane {
    /// Channel `c` (0 red, 1 green, 2 blue) of an RGB image.
    pub fn channel(image: &image::RgbImage, c: usize) -> Plane {
        Plane {
            width: image.width() as usize,
            height: image.height() as usize,
            samples: image.pixels().map(|p| p[c] as f64).collect(),
        }
    }

    /// Luma by BT.601 weights on the values as stored.
    pub fn luma(image: &image::RgbImage) -> Plane {
        Plane {
            width: image.width() as usize,
            height: image.height() as usize,
            samples: image
                .pixels()
                .map(|p| 0.299 * p[0] as f64 + 0.587 * p[1] as f64 + 0.114 * p[2] as f64)
                .collect(),
        }
    }
}

const WINDOW: usize = 11;
const SIGMA: f64 = 1.5;

fn gaussian() -> [f64; WINDOW] {
    let mut weights = [0.0; WINDOW];
    let centre = (WINDOW / 2) as f64;
    for (i, w) in weights.iter_mut().enumerate() {
        let d = i as f64 - centre;
        *w = (-(d * d) / (2.0 * SIGMA * SIGMA)).exp();
    }
    let sum: f64 = weights.iter().sum();
    weights.map(|w| w / sum)
}

/// Mean SSIM over every full window.
pub fn ssim(a: &Plane, b: &Plane) -> Result<f64, String> {
    if (a.width, a.height) != (b.width, b.height) {
        return Err(format!(
            "sizes differ: {}x{} and {}x{}",
            a.width, a.height, b.width, b.height
        ));
    }
    let (w, h) = (a.width, a.height);
    if w == 0 || h == 0 {
        return Err("an empty image".into());
    }
    // Below the window's size: one uniform window over the whole image.
    let (weights_x, weights_y) = if w < WINDOW || h < WINDOW {
        (vec![1.0 / w as f64; w], vec![1.0 / h as f64; h])
    } else {
        (gaussian().to_vec(), gaussian().to_vec())
    };
    let (c1, c2) = ((0.01f64 * 255.0).powi(2), (0.03f64 * 255.0).powi(2));
    let mut total = 0.0;
    let mut windows = 0usize;
    for y in 0..=h - weights_y.len() {
        for x in 0..=w - weights_x.len() {
            let (mut ma, mut mb, mut saa, mut sbb, mut sab) = (0.0, 0.0, 0.0, 0.0, 0.0);
            for (dy, gy) in weights_y.iter().enumerate() {
                let row = (y + dy) * w + x;
                for (dx, gx) in weights_x.iter().enumerate() {
                    let weight = gy * gx;
                    let (pa, pb) = (a.samples[row + dx], b.samples[row + dx]);
                    ma += weight * pa;
                    mb += weight * pb;
                    saa += weight * pa * pa;
                    sbb += weight * pb * pb;
                    sab += weight * pa * pb;
                }
            }
            let (va, vb, cov) = (saa - ma * ma, sbb - mb * mb, sab - ma * mb);
            total += ((2.0 * ma * mb + c1) * (2.0 * cov + c2))
                / ((ma * ma + mb * mb + c1) * (va + vb + c2));
            windows += 1;
        }
    }
    Ok(total / windows as f64)
}

/// SSIM of each of the red, green and blue channels.
pub fn ssim_rgb(a: &image::RgbImage, b: &image::RgbImage) -> Result<[f64; 3], String> {
    Ok([
        ssim(&Plane::channel(a, 0), &Plane::channel(b, 0))?,
        ssim(&Plane::channel(a, 1), &Plane::channel(b, 1))?,
        ssim(&Plane::channel(a, 2), &Plane::channel(b, 2))?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plane(width: usize, height: usize, f: impl Fn(usize, usize) -> f64) -> Plane {
        let samples = (0..height)
            .flat_map(|y| (0..width).map(move |x| (x, y)))
            .map(|(x, y)| f(x, y))
            .collect();
        Plane {
            width,
            height,
            samples,
        }
    }

    #[test]
    fn identical_images_score_one_and_damage_scores_less() {
        let texture = |x: usize, y: usize| ((x * 37 + y * 91) % 256) as f64;
        for (w, h) in [(40, 30), (7, 3)] {
            let a = plane(w, h, texture);
            assert!((ssim(&a, &a).unwrap() - 1.0).abs() < 1e-12);
            let noisy = plane(w, h, |x, y| {
                (texture(x, y) + if (x + y) % 2 == 0 { 20.0 } else { -20.0 }).clamp(0.0, 255.0)
            });
            let flat = plane(w, h, |_, _| 128.0);
            let (slightly, badly) = (ssim(&a, &noisy).unwrap(), ssim(&a, &flat).unwrap());
            assert!(
                slightly < 1.0 && badly < slightly,
                "{w}x{h}: {slightly} {badly}"
            );
        }
    }

    #[test]
    fn sizes_must_match() {
        let a = plane(20, 20, |_, _| 0.0);
        let b = plane(21, 20, |_, _| 0.0);
        assert!(ssim(&a, &b).unwrap_err().contains("sizes differ"));
    }
}
