//! A thumbnail's JPEG, written as web encoders write it: jpeg-encoder's
//! one interleaved baseline scan, written again in fewer bytes by
//! `optimize` or `progressive`. Here rather than in the step so that
//! jpeg-encoder's generic code is built with this crate's `opt-level`.

use jpeg_encoder::{ChromaSubsamplingMethod, ColorType, Encoder, EncodingError, SamplingFactor};

/// RGB pixels (three bytes a pixel, `size` across and down) as a JPEG:
/// 4:2:0 chroma below quality 90 (libjpeg's and libvips' threshold; 4:4:4
/// at 90 and above), chroma averaged over each 2×2 block as libjpeg does
/// (not its top-left pixel), optimal Huffman tables, one interleaved
/// baseline scan or (`progressive`) libjpeg's progressive scans, and the
/// Annex K quantisation tables that libjpeg, libvips and ImageMagick
/// scale by the same quality number. Of jpeg-encoder's tables, Annex K
/// gave the most SSIM per byte on bench/thumbnail.sh's input
/// (ImageMagick's and the MS-SSIM-tuned ones were smaller but lost more
/// SSIM than the bytes they saved). Nothing but pixels is written.
pub fn rgb(
    pixels: &[u8],
    (width, height): (u16, u16),
    quality: u8,
    progressive: bool,
) -> Result<Vec<u8>, EncodingError> {
    let encode = |progressive: bool| {
        let mut out = Vec::new();
        let mut encoder = Encoder::new(&mut out, quality);
        encoder.set_sampling_factor(if quality < 90 {
            SamplingFactor::R_4_2_0
        } else {
            SamplingFactor::R_4_4_4
        });
        encoder.set_chroma_subsampling_method(ChromaSubsamplingMethod::Average);
        encoder.set_quantization_tables(TABLES, TABLES);
        // Not jpeg-encoder's optimised tables: it writes them with one scan
        // per component, and zune-jpeg (the `image` crate's JPEG decoder,
        // 0.5.15) misreads such 4:2:0 files (SSIM 0.24 against
        // libjpeg-turbo's decode of the same bytes): browsers would cope,
        // Rust services would not. Nor its progressive files, larger than
        // its baseline ones (see `progressive`). Its one interleaved
        // baseline scan is written again by `optimize` or `progressive`,
        // same coefficients, fewer bytes.
        encoder.set_progressive(progressive);
        encoder.encode(pixels, width, height, ColorType::Rgb)?;
        Ok(out)
    };
    let baseline = encode(false)?;
    let recoded = if progressive {
        super::progressive::progressive(&baseline)
    } else {
        super::optimize::optimize(&baseline)
    };
    match recoded {
        Some(recoded) => Ok(recoded),
        // Not the shape jpeg-encoder writes (never seen): progressive was
        // asked for, so jpeg-encoder's own; a baseline file stays as is.
        None if progressive => encode(true),
        None => Ok(baseline),
    }
}

/// The quantisation tables JPEG outputs use (see `rgb`).
const TABLES: jpeg_encoder::QuantizationTableType = jpeg_encoder::QuantizationTableType::Default;
