//! Resizing 16-bit images: a plain separable Lanczos3 over `f32`, alpha
//! premultiplied, as `fast_image_resize` does for 8 bits.
//!
//! Why not `fast_image_resize`'s own 16-bit pixel types: their SIMD code
//! added 882 KB to the arm64 bootstrap (9.46 MB against 8.58 MB, measured
//! with `make lambda`), for inputs that are rare (16-bit PNG and TIFF;
//! cameras and phones write 8-bit JPEG and HEIC). This loop is slower than
//! SIMD, about a quarter of a second for a 12 MP image on one core, and
//! small.

/// Lanczos with three lobes.
fn lanczos3(x: f64) -> f64 {
    if x == 0.0 {
        return 1.0;
    }
    if x.abs() >= 3.0 {
        return 0.0;
    }
    let px = std::f64::consts::PI * x;
    3.0 * px.sin() * (px / 3.0).sin() / (px * px)
}

/// For each of `out` samples over the source span `start .. start + len`
/// (of `size` samples): the first source index and its normalised weights.
fn weights(size: usize, start: f64, len: f64, out: usize) -> Vec<(usize, Vec<f32>)> {
    let scale = len / out as f64;
    let stretch = scale.max(1.0);
    let support = 3.0 * stretch;
    (0..out)
        .map(|i| {
            let centre = start + (i as f64 + 0.5) * scale;
            let first = ((centre - support).floor().max(0.0)) as usize;
            let last = ((centre + support).ceil() as usize).min(size);
            let first = first.min(last.saturating_sub(1));
            let mut taps: Vec<f64> = (first..last)
                .map(|j| lanczos3((j as f64 + 0.5 - centre) / stretch))
                .collect();
            let sum: f64 = taps.iter().sum();
            if sum.abs() > f64::EPSILON {
                taps.iter_mut().for_each(|w| *w /= sum);
            }
            (first, taps.into_iter().map(|w| w as f32).collect())
        })
        .collect()
}

/// Resizes `source` (`width` × `height` pixels of `channels` 16-bit
/// samples; with 4 channels the last is alpha) from the rectangle `crop`
/// (left, top, width, height, in source pixels) to `out_w` × `out_h`.
pub fn resize(
    source: &[u16],
    (width, height): (u32, u32),
    channels: usize,
    crop: (f64, f64, f64, f64),
    (out_w, out_h): (u32, u32),
) -> Vec<u16> {
    let (w, h, ow, oh) = (
        width as usize,
        height as usize,
        out_w as usize,
        out_h as usize,
    );
    let alpha = channels == 4;
    let columns = weights(w, crop.0, crop.2, ow);
    let rows = weights(h, crop.1, crop.3, oh);
    // The source rows the vertical pass reads.
    let row_first = rows.iter().map(|(first, _)| *first).min().unwrap_or(0);
    let row_end = rows
        .iter()
        .map(|(first, taps)| first + taps.len())
        .max()
        .unwrap_or(0);
    // Horizontal pass, premultiplied: (row_end - row_first) rows of ow.
    let mut across = vec![0f32; (row_end - row_first) * ow * channels];
    let mut pixel = vec![0f32; channels];
    for y in row_first..row_end {
        let line = &source[y * w * channels..(y + 1) * w * channels];
        for (x, (first, taps)) in columns.iter().enumerate() {
            pixel.iter_mut().for_each(|p| *p = 0.0);
            for (k, weight) in taps.iter().enumerate() {
                let at = (first + k) * channels;
                let a = if alpha {
                    line[at + 3] as f32 / 65535.0
                } else {
                    1.0
                };
                for c in 0..channels {
                    let v = line[at + c] as f32;
                    let v = if alpha && c < 3 { v * a } else { v };
                    pixel[c] += weight * v;
                }
            }
            let at = ((y - row_first) * ow + x) * channels;
            across[at..at + channels].copy_from_slice(&pixel);
        }
    }
    // Vertical pass, then un-premultiplied and rounded.
    let mut out = vec![0u16; ow * oh * channels];
    for (y, (first, taps)) in rows.iter().enumerate() {
        for x in 0..ow {
            pixel.iter_mut().for_each(|p| *p = 0.0);
            for (k, weight) in taps.iter().enumerate() {
                let at = ((first + k - row_first) * ow + x) * channels;
                for c in 0..channels {
                    pixel[c] += weight * across[at + c];
                }
            }
            if alpha {
                let a = pixel[3].clamp(0.0, 65535.0) / 65535.0;
                for p in &mut pixel[..3] {
                    *p = if a > 0.0 { *p / a } else { 0.0 };
                }
            }
            let at = (y * ow + x) * channels;
            for c in 0..channels {
                out[at + c] = pixel[c].round().clamp(0.0, 65535.0) as u16;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_size_is_the_same_image_and_flat_stays_flat() {
        let source: Vec<u16> = (0..5 * 4 * 3).map(|i| (i * 997) as u16).collect();
        let same = resize(&source, (5, 4), 3, (0.0, 0.0, 5.0, 4.0), (5, 4));
        assert_eq!(same, source);
        let flat = vec![40_000u16; 64 * 48 * 3];
        let small = resize(&flat, (64, 48), 3, (0.0, 0.0, 64.0, 48.0), (10, 7));
        assert!(small.iter().all(|&v| v == 40_000), "{small:?}");
    }

    #[test]
    fn transparent_pixels_do_not_bleed_their_colour() {
        // Opaque white beside fully transparent black: premultiplied, the
        // colour of the mixed pixels stays white, only alpha drops.
        let mut source = Vec::new();
        for x in 0..8 {
            source.extend_from_slice(&if x < 4 {
                [65535, 65535, 65535, 65535]
            } else {
                [0, 0, 0, 0]
            });
        }
        let out = resize(&source, (8, 1), 4, (0.0, 0.0, 8.0, 1.0), (2, 1));
        for pixel in out.chunks(4) {
            if pixel[3] > 1000 {
                assert!(pixel[..3].iter().all(|&c| c > 65_000), "{pixel:?}");
            }
        }
    }
}
