//! Optimal Huffman tables for a baseline JPEG, keeping its one interleaved
//! scan (what `jpegtran -optimize` does to a baseline file).
//!
//! jpeg-encoder writes Annex K's example tables, or optimised ones only
//! with one scan per component, which zune-jpeg 0.5.15 (the `image`
//! crate's JPEG decoder) misreads for 4:2:0. So the thumbnail's JPEG is
//! written with the example tables in one interleaved scan, and this
//! module writes that scan's coefficients again (`coefficients`) with
//! tables fitted to them (`scan_writer`). The pixels are bit-identical;
//! the file is ~5-6% smaller.

use super::coefficients::{for_each_block, Baseline};
use super::scan_writer::{write_scan, Token};

/// The JPEG with optimal Huffman tables, or `None` if it is not a baseline
/// file of the shape jpeg-encoder writes (then keep the original).
pub fn optimize(jpeg: &[u8]) -> Option<Vec<u8>> {
    let baseline = Baseline::read(jpeg)?;
    let frame = &baseline.frame;
    let all: Vec<usize> = (0..frame.components.len()).collect();
    let mut tokens = Vec::new();
    let mut predictions = vec![0i32; all.len()];
    for_each_block(frame, &baseline.planes, &all, |ci, block| {
        let c = &frame.components[ci];
        let dc = block[0] as i32;
        tokens.push(Token::value(c.dc as u8, 0, dc - predictions[ci]));
        predictions[ci] = dc;
        let mut run = 0;
        for &value in &block[1..] {
            if value == 0 {
                run += 1;
                continue;
            }
            while run > 15 {
                tokens.push(Token::value(c.ac as u8, 15, 0)); // ZRL
                run -= 16;
            }
            tokens.push(Token::value(c.ac as u8, run, value as i32));
            run = 0;
        }
        if run > 0 {
            tokens.push(Token::value(c.ac as u8, 0, 0)); // End of block.
        }
    });
    let mut out = Vec::with_capacity(jpeg.len());
    out.extend_from_slice(&[0xFF, 0xD8]);
    for segment in &baseline.segments {
        out.extend_from_slice(segment);
    }
    write_scan(&mut out, baseline.scan_header, &tokens);
    out.extend_from_slice(&[0xFF, 0xD9]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::super::test_images::{busy_jpeg, busy_jpeg_progressive, pixels};
    use super::*;
    use jpeg_encoder::ColorType::Rgb;

    #[test]
    fn the_same_pixels_in_fewer_bytes() {
        use jpeg_encoder::SamplingFactor::{R_4_2_0, R_4_4_4};
        // Sizes that are and are not whole MCUs.
        for (w, h, quality, sampling) in [
            (64, 48, 82, R_4_2_0),
            (101, 67, 82, R_4_2_0),
            (99, 33, 95, R_4_4_4),
            (1, 1, 50, R_4_2_0),
            (320, 213, 30, R_4_2_0),
        ] {
            let original = busy_jpeg(w, h, quality, Rgb, sampling);
            let optimized = optimize(&original).expect("jpeg-encoder's shape");
            assert!(
                optimized.len() < original.len() || w == 1,
                "{w}x{h}: {} -> {}",
                original.len(),
                optimized.len()
            );
            assert_eq!(pixels(&optimized), pixels(&original), "{w}x{h}");
        }
    }

    #[test]
    fn other_shapes_come_back_as_none() {
        assert_eq!(optimize(&busy_jpeg_progressive(8, 8, 80)), None);
        assert_eq!(optimize(b"not a jpeg"), None);
        let original = busy_jpeg(64, 48, 82, Rgb, jpeg_encoder::SamplingFactor::R_4_2_0);
        // Cut short: no EOI where the scan ends.
        assert_eq!(optimize(&original[..original.len() - 40]), None);
    }
}
