//! The structural similarity of two images of the same size, for
//! `bench/thumbnail.sh`:
//!
//!     ssim REFERENCE CANDIDATE
//!
//! Prints the mean SSIM (Wang et al., 2004) of their luma: BT.601 weights on
//! the 8-bit values as stored, an 11×11 Gaussian window (σ = 1.5), K1 = 0.01,
//! K2 = 0.03, L = 255; windows that would leave the image are skipped. These
//! are the paper's constants, so figures compare with other tools' SSIM.
//! 1 means identical; JPEG thumbnails at quality 80–90 score about 0.95–0.99.
//!
//! Written here rather than taken from a crate: the maintained SSIM crates
//! are AGPL (dssim) or bring their own image pipelines, and ImageMagick 6
//! (Debian's) has no SSIM metric.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [reference, candidate] = args.as_slice() else {
        eprintln!("usage: ssim REFERENCE CANDIDATE");
        return ExitCode::from(2);
    };
    let result = luma(reference).and_then(|a| {
        let b = luma(candidate)?;
        ssim(&a, &b).map_err(|problem| format!("{reference} and {candidate}: {problem}"))
    });
    match result {
        Ok(score) => {
            println!("{score:.5}");
            ExitCode::SUCCESS
        }
        Err(problem) => {
            eprintln!("ssim: {problem}");
            ExitCode::FAILURE
        }
    }
}

/// A grey image as f64 samples, row by row.
struct Luma {
    width: usize,
    height: usize,
    samples: Vec<f64>,
}

fn luma(path: &str) -> Result<Luma, String> {
    let image = image::open(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let rgb = image.to_rgb8();
    let samples = rgb
        .pixels()
        .map(|p| 0.299 * p[0] as f64 + 0.587 * p[1] as f64 + 0.114 * p[2] as f64)
        .collect();
    Ok(Luma {
        width: rgb.width() as usize,
        height: rgb.height() as usize,
        samples,
    })
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
fn ssim(a: &Luma, b: &Luma) -> Result<f64, String> {
    if (a.width, a.height) != (b.width, b.height) {
        return Err(format!(
            "sizes differ: {}x{} and {}x{}",
            a.width, a.height, b.width, b.height
        ));
    }
    if a.width < WINDOW || a.height < WINDOW {
        return Err(format!("smaller than the {WINDOW}x{WINDOW} window"));
    }
    let (c1, c2) = ((0.01f64 * 255.0).powi(2), (0.03f64 * 255.0).powi(2));
    let g = gaussian();
    let (w, h) = (a.width, a.height);
    let mut total = 0.0;
    let mut windows = 0usize;
    for y in 0..=h - WINDOW {
        for x in 0..=w - WINDOW {
            let (mut ma, mut mb, mut saa, mut sbb, mut sab) = (0.0, 0.0, 0.0, 0.0, 0.0);
            for (dy, gy) in g.iter().enumerate() {
                let row = (y + dy) * w + x;
                for (dx, gx) in g.iter().enumerate() {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn image(width: usize, height: usize, f: impl Fn(usize, usize) -> f64) -> Luma {
        let samples = (0..height)
            .flat_map(|y| (0..width).map(move |x| (x, y)))
            .map(|(x, y)| f(x, y))
            .collect();
        Luma {
            width,
            height,
            samples,
        }
    }

    #[test]
    fn identical_images_score_one_and_damage_scores_less() {
        let texture = |x: usize, y: usize| ((x * 37 + y * 91) % 256) as f64;
        let a = image(40, 30, texture);
        assert!((ssim(&a, &a).unwrap() - 1.0).abs() < 1e-12);
        let noisy = image(40, 30, |x, y| {
            (texture(x, y) + if (x + y) % 2 == 0 { 20.0 } else { -20.0 }).clamp(0.0, 255.0)
        });
        let flat = image(40, 30, |_, _| 128.0);
        let (slightly, badly) = (ssim(&a, &noisy).unwrap(), ssim(&a, &flat).unwrap());
        assert!(slightly < 1.0 && badly < slightly, "{slightly} {badly}");
    }

    #[test]
    fn sizes_must_match() {
        let a = image(20, 20, |_, _| 0.0);
        let b = image(21, 20, |_, _| 0.0);
        assert!(ssim(&a, &b).unwrap_err().contains("sizes differ"));
    }
}
