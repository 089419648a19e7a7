//! Encoding outputs: JPEG (jpeg-encoder), PNG (`image`) and lossy WebP
//! (libwebp through the `webp` crate; `image` only writes lossless WebP).
//! AVIF is encoded by ffmpeg (`avif.rs`), asynchronously, by the step.

use image::DynamicImage;

use super::Format;
use crate::step::StepError;

/// How outputs are encoded: the params' format, quality and scan order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoding {
    pub format: Format,
    pub quality: u8,
    pub progressive: bool,
}

/// Encodes deterministically. Nothing but pixels is written: no EXIF (the
/// orientation is already applied), XMP, comments or ICC profile (outputs
/// are sRGB, which is what a browser assumes of an untagged image).
pub fn encode(image: &DynamicImage, encoding: Encoding) -> Result<Vec<u8>, StepError> {
    let failed = |e: image::ImageError| StepError::Failed(format!("encoding failed: {e}"));
    let Encoding {
        format,
        quality,
        progressive,
    } = encoding;
    let mut out = Vec::new();
    match format {
        Format::Jpeg => encode_jpeg(&image.to_rgb8(), quality, progressive, &mut out)?,
        Format::Png => {
            let encoder = image::codecs::png::PngEncoder::new(&mut out);
            image.write_with_encoder(encoder).map_err(failed)?;
        }
        Format::Webp => {
            let (w, h) = (image.width(), image.height());
            // 8-bit pixels as they are; 16-bit ones reduced (one copy).
            let memory = match image {
                DynamicImage::ImageRgba8(rgba) => {
                    webp::Encoder::from_rgba(rgba.as_raw(), w, h).encode(quality as f32)
                }
                DynamicImage::ImageRgb8(rgb) => {
                    webp::Encoder::from_rgb(rgb.as_raw(), w, h).encode(quality as f32)
                }
                other if other.color().has_alpha() => {
                    webp::Encoder::from_rgba(other.to_rgba8().as_raw(), w, h).encode(quality as f32)
                }
                other => {
                    webp::Encoder::from_rgb(other.to_rgb8().as_raw(), w, h).encode(quality as f32)
                }
            };
            out.extend_from_slice(&memory);
        }
        Format::Avif => {
            return Err(StepError::Failed(
                "AVIF is encoded by the thumbnail step through ffmpeg, not by encode()".into(),
            ))
        }
    }
    Ok(out)
}

/// JPEG as web encoders write it: 4:2:0 chroma below quality 90 (libjpeg's
/// and libvips' threshold; 4:4:4 at 90 and above), chroma averaged over each
/// 2×2 block as libjpeg does (not its top-left pixel), optimal Huffman
/// tables, one interleaved baseline scan or (on request) libjpeg's
/// progressive scans, and the Annex K quantisation tables that libjpeg,
/// libvips and ImageMagick scale by the same quality number. Of
/// jpeg-encoder's tables, Annex K gave the most SSIM per byte on
/// bench/thumbnail.sh's input (ImageMagick's and the MS-SSIM-tuned ones
/// were smaller but lost more SSIM than the bytes they saved).
fn encode_jpeg(
    rgb: &image::RgbImage,
    quality: u8,
    progressive: bool,
    out: &mut Vec<u8>,
) -> Result<(), StepError> {
    use jpeg_encoder::{ChromaSubsamplingMethod, ColorType, Encoder, SamplingFactor};
    let (width, height) = (rgb.width(), rgb.height());
    let too_large = || {
        StepError::Failed(format!(
            "a {width}x{height} JPEG is over 65535 pixels a side"
        ))
    };
    let (w, h) = (
        u16::try_from(width).map_err(|_| too_large())?,
        u16::try_from(height).map_err(|_| too_large())?,
    );
    let encode = |progressive: bool, out: &mut Vec<u8>| {
        let mut encoder = Encoder::new(out, quality);
        encoder.set_sampling_factor(if quality < 90 {
            SamplingFactor::R_4_2_0
        } else {
            SamplingFactor::R_4_4_4
        });
        encoder.set_chroma_subsampling_method(ChromaSubsamplingMethod::Average);
        encoder.set_quantization_tables(JPEG_TABLES, JPEG_TABLES);
        // Not jpeg-encoder's optimised tables: it writes them with one scan
        // per component, and zune-jpeg (the `image` crate's JPEG decoder,
        // 0.5.15) misreads such 4:2:0 files (SSIM 0.24 against
        // libjpeg-turbo's decode of the same bytes): browsers would cope,
        // Rust services would not. Nor its progressive files, larger than
        // its baseline ones (see `jpeg::progressive`). Its one interleaved
        // baseline scan is written again by `jpeg::optimize` or
        // `jpeg::progressive`, same coefficients, fewer bytes.
        encoder.set_progressive(progressive);
        encoder
            .encode(rgb.as_raw(), w, h, ColorType::Rgb)
            .map_err(|e| StepError::Failed(format!("encoding failed: {e}")))
    };
    encode(false, out)?;
    let recoded = if progressive {
        super::jpeg::progressive::progressive(out)
    } else {
        super::jpeg::optimize::optimize(out)
    };
    match recoded {
        Some(recoded) => *out = recoded,
        // Not the shape jpeg-encoder writes (never seen): progressive was
        // asked for, so jpeg-encoder's own; a baseline file stays as is.
        None if progressive => {
            out.clear();
            encode(true, out)?;
        }
        None => {}
    }
    Ok(())
}

/// The quantisation tables JPEG outputs use (see `encode_jpeg`).
const JPEG_TABLES: jpeg_encoder::QuantizationTableType =
    jpeg_encoder::QuantizationTableType::Default;
