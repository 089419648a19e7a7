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
        Format::Jpeg => match image {
            DynamicImage::ImageRgb8(rgb) => encode_jpeg(rgb, quality, progressive, &mut out)?,
            other => encode_jpeg(&other.to_rgb8(), quality, progressive, &mut out)?,
        },
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

/// JPEG as `mediaonce_jpeg::write` writes it: 4:2:0 below quality 90,
/// optimal Huffman tables, baseline or progressive.
fn encode_jpeg(
    rgb: &image::RgbImage,
    quality: u8,
    progressive: bool,
    out: &mut Vec<u8>,
) -> Result<(), StepError> {
    let (width, height) = (rgb.width(), rgb.height());
    let too_large = || {
        StepError::Failed(format!(
            "a {width}x{height} JPEG is over 65535 pixels a side"
        ))
    };
    let size = (
        u16::try_from(width).map_err(|_| too_large())?,
        u16::try_from(height).map_err(|_| too_large())?,
    );
    *out = mediaonce_jpeg::write::rgb(rgb.as_raw(), size, quality, progressive)
        .map_err(|e| StepError::Failed(format!("encoding failed: {e}")))?;
    Ok(())
}
