//! Decoding: the declared size checked before a pixel is decoded, EXIF
//! orientation, shrink-on-load for JPEG, and colour to sRGB.

use std::io::Cursor;

use image::metadata::Orientation;
use image::{DynamicImage, ImageDecoder, ImageReader};

use super::colour;
use super::{plan, Plan, ThumbnailParams};
use crate::step::StepError;

/// Decodes an image, refusing one whose declared size is over `max_pixels`
/// before decoding it, and turns it upright by its EXIF orientation.
pub fn decode(bytes: &[u8], max_pixels: u64) -> Result<DynamicImage, StepError> {
    match open(bytes, max_pixels)? {
        Opened::Jpeg(jpeg) => {
            let (w, h) = (jpeg.width, jpeg.height);
            decode_jpeg(jpeg, w, h)
        }
        Opened::Other(header) => decode_opened(header),
    }
}

/// An image's header, read and checked: a format this build decodes, no
/// more than `max_pixels` declared. Nothing is decoded yet.
enum Opened<'a, D> {
    /// JPEG: decoded by jpeg-decoder, at a DCT scale when that is enough.
    Jpeg(Box<JpegHeader<'a>>),
    /// The other formats, by `image`'s decoders.
    Other(Header<D>),
}

struct JpegHeader<'a> {
    bytes: &'a [u8],
    /// The decoder that read the header: it decodes the pixels too.
    decoder: jpeg_decoder::Decoder<Cursor<&'a [u8]>>,
    width: u32,
    height: u32,
    orientation: Orientation,
}

struct Header<D> {
    decoder: D,
    orientation: Orientation,
}

fn undecodable(e: image::ImageError) -> StepError {
    StepError::Unprocessable(format!("undecodable image: {e}"))
}

fn jpeg_failed(e: jpeg_decoder::Error) -> StepError {
    StepError::Unprocessable(format!("undecodable image: {e}"))
}

fn open(bytes: &[u8], max_pixels: u64) -> Result<Opened<'_, impl ImageDecoder + '_>, StepError> {
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| StepError::Unprocessable(format!("undecodable image: {e}")))?;
    let format = reader.format();
    if !readable(format) {
        return Err(unknown_format(bytes, format));
    }
    if format == Some(image::ImageFormat::Jpeg) {
        let mut decoder = jpeg_decoder::Decoder::new(Cursor::new(bytes));
        decoder.read_info().map_err(jpeg_failed)?;
        let info = decoder.info().expect("read_info succeeded");
        let (width, height) = (info.width as u32, info.height as u32);
        check_pixels(width, height, max_pixels)?;
        let orientation = decoder
            .exif_data()
            .and_then(Orientation::from_exif_chunk)
            .unwrap_or(Orientation::NoTransforms);
        return Ok(Opened::Jpeg(Box::new(JpegHeader {
            bytes,
            decoder,
            width,
            height,
            orientation,
        })));
    }
    let mut decoder = reader.into_decoder().map_err(undecodable)?;
    let (width, height) = decoder.dimensions();
    check_pixels(width, height, max_pixels)?;
    let orientation = decoder.orientation().map_err(undecodable)?;
    Ok(Opened::Other(Header {
        decoder,
        orientation,
    }))
}

/// A JPEG at the smallest DCT scale that gives `need_w` × `need_h` (its
/// full size at most), in sRGB and upright.
fn decode_jpeg(
    header: Box<JpegHeader>,
    need_w: u32,
    need_h: u32,
) -> Result<DynamicImage, StepError> {
    let (need_w, need_h) = (need_w.min(header.width), need_h.min(header.height));
    let orientation = header.orientation;
    let full = (header.width, header.height);
    let mut image = decode_jpeg_dct(header.bytes, full, header.decoder, need_w, need_h)?
        .ok_or_else(|| {
            StepError::Unprocessable(
                "undecodable image: a JPEG of 16-bit samples, which this build does not read"
                    .into(),
            )
        })?;
    image.apply_orientation(orientation);
    Ok(image)
}

/// The whole image behind an opened header, in sRGB and upright.
fn decode_opened(header: Header<impl ImageDecoder>) -> Result<DynamicImage, StepError> {
    let Header {
        mut decoder,
        orientation,
    } = header;
    let icc = decoder.icc_profile().map_err(undecodable)?;
    let image = DynamicImage::from_decoder(decoder).map_err(undecodable)?;
    let mut image = in_srgb(image, icc.as_deref());
    image.apply_orientation(orientation);
    Ok(image)
}

/// Whether this build decodes the format `image` guessed.
fn readable(format: Option<image::ImageFormat>) -> bool {
    use image::ImageFormat::*;
    matches!(format, Some(Jpeg | Png | WebP | Gif | Tiff))
}

/// The error for bytes no decoder here reads, naming the format when it is
/// one phones write (HEIC, AVIF: ISO BMFF with an `ftyp` brand), so the job
/// log says what the upload was rather than only what it was not.
fn unknown_format(bytes: &[u8], guessed: Option<image::ImageFormat>) -> StepError {
    let brand = (bytes.len() >= 12 && &bytes[4..8] == b"ftyp").then(|| &bytes[8..12]);
    let named = match brand {
        Some(b"heic" | b"heix" | b"heim" | b"heis" | b"hevc" | b"hevx" | b"mif1" | b"msf1") => {
            Some("HEIC/HEIF")
        }
        Some(b"avif" | b"avis") => Some("AVIF"),
        _ => guessed.map(|format| format.extensions_str()[0]),
    };
    StepError::Unprocessable(match named {
        Some(format @ ("HEIC/HEIF" | "AVIF")) => format!(
            "unsupported image format: {format} (decoded by the thumbnail step through ffmpeg; \
             decode() reads JPEG, PNG, WebP, GIF and TIFF)"
        ),
        Some(format) => format!(
            "unsupported image format: {format} (this build decodes JPEG, PNG, WebP, GIF, TIFF, \
             and through ffmpeg HEIC and AVIF)"
        ),
        None => "undecodable image: not JPEG, PNG, WebP, GIF or TIFF".into(),
    })
}

/// The image converted to sRGB from its profile; a profile that cannot be
/// applied is logged and ignored (see `colour`).
fn in_srgb(image: DynamicImage, icc: Option<&[u8]>) -> DynamicImage {
    let (image, conversion) = colour::to_srgb(image, icc);
    log_ignored(conversion);
    image
}

fn log_ignored(conversion: colour::Conversion) {
    if let colour::Conversion::Ignored(why) = conversion {
        tracing::warn!(problem = %why, "the image's colour profile was ignored; taken as sRGB");
    }
}

/// Whether an orientation turns the image a quarter (width and height swap).
fn swaps_axes(orientation: Orientation) -> bool {
    matches!(
        orientation,
        Orientation::Rotate90
            | Orientation::Rotate270
            | Orientation::Rotate90FlipH
            | Orientation::Rotate270FlipH
    )
}

/// Decodes an image for the outputs `params` asks for, and returns it with
/// their plans (crops in the decoded image's pixels). A JPEG whose outputs
/// are at most half its size is decoded at 1/2, 1/4 or 1/8 scale through its
/// DCT (libvips' shrink-on-load): less work, less memory. Anything else is
/// decoded in full.
pub fn decode_for(
    bytes: &[u8],
    max_pixels: u64,
    params: &ThumbnailParams,
) -> Result<(DynamicImage, Vec<Plan>), StepError> {
    let opened = open(bytes, max_pixels)?;
    let (stored_w, stored_h, orientation) = match &opened {
        Opened::Jpeg(jpeg) => (jpeg.width, jpeg.height, jpeg.orientation),
        Opened::Other(header) => {
            let (w, h) = header.decoder.dimensions();
            (w, h, header.orientation)
        }
    };
    let (w, h) = if swaps_axes(orientation) {
        (stored_h, stored_w)
    } else {
        (stored_w, stored_h)
    };
    let plans = plan(w, h, params);
    let jpeg = match opened {
        Opened::Jpeg(jpeg) => jpeg,
        Opened::Other(header) => return Ok((decode_opened(header)?, plans)),
    };
    // The smallest decoded size that still gives every output its pixels.
    let need = |out: u32, crop: f64, whole: u32| ((out as f64) * whole as f64 / crop).ceil() as u32;
    let need_w = plans
        .iter()
        .map(|p| need(p.width, p.crop.2, w))
        .max()
        .unwrap_or(w);
    let need_h = plans
        .iter()
        .map(|p| need(p.height, p.crop.3, h))
        .max()
        .unwrap_or(h);
    let (need_w, need_h) = if swaps_axes(orientation) {
        (need_h, need_w)
    } else {
        (need_w, need_h)
    };
    let image = decode_jpeg(jpeg, need_w, need_h)?;
    if image.width() == w {
        return Ok((image, plans));
    }
    // Decoded smaller: the crops in the decoded image's pixels.
    let factor = image.width() as f64 / w as f64;
    let plans = plans
        .into_iter()
        .map(|p| {
            let (x, y, cw, ch) = p.crop;
            Plan {
                crop: (x * factor, y * factor, cw * factor, ch * factor),
                ..p
            }
        })
        .collect();
    Ok((image, plans))
}

/// A JPEG decoded through its DCT at the smallest of the scales 1/8, 1/4,
/// 1/2 and 1 that is at least `need_w` × `need_h`, in sRGB; `None` when no
/// scale is. jpeg-decoder picks the scale (its `full_w` × `full_h` header
/// read already) and decodes, unless `jpeg::scaled` reads the file at a
/// reduced scale. CMYK and YCCK come out as inks and go through the
/// image's CMYK profile (`colour::cmyk_to_srgb`).
fn decode_jpeg_dct(
    bytes: &[u8],
    (full_w, full_h): (u32, u32),
    mut decoder: jpeg_decoder::Decoder<Cursor<&[u8]>>,
    need_w: u32,
    need_h: u32,
) -> Result<Option<DynamicImage>, StepError> {
    let clamp = |n: u32| n.clamp(1, u16::MAX as u32) as u16;
    let (w, h) = decoder
        .scale(clamp(need_w), clamp(need_h))
        .map_err(jpeg_failed)?;
    let (w, h) = (w as u32, h as u32);
    if w < need_w || h < need_h {
        return Ok(None);
    }
    let icc = decoder.icc_profile();
    // At 1/8, 1/4 or 1/2 scale, only the coefficients the scale needs are
    // decoded, when the file is of the common shape (`jpeg::scaled`: the
    // same pixels, in about half the time).
    let eighths = [1, 2, 4]
        .into_iter()
        .find(|&n| (w, h) == ((full_w * n).div_ceil(8), (full_h * n).div_ceil(8)));
    let scaled =
        eighths.and_then(|n| super::jpeg::scaled::decode(bytes, n as usize, (full_w, full_h)));
    if let Some(scaled) = scaled.filter(|s| (s.width, s.height) == (w, h)) {
        let image = if scaled.grey {
            image::GrayImage::from_raw(w, h, scaled.pixels).map(DynamicImage::ImageLuma8)
        } else {
            image::RgbImage::from_raw(w, h, scaled.pixels).map(DynamicImage::ImageRgb8)
        };
        return Ok(image.map(|image| in_srgb(image, icc.as_deref())));
    }
    let pixels = decoder.decode().map_err(jpeg_failed)?;
    let format = decoder.info().map(|info| info.pixel_format);
    let image = match format {
        Some(jpeg_decoder::PixelFormat::RGB24) => {
            image::RgbImage::from_raw(w, h, pixels).map(DynamicImage::ImageRgb8)
        }
        Some(jpeg_decoder::PixelFormat::L8) => {
            image::GrayImage::from_raw(w, h, pixels).map(DynamicImage::ImageLuma8)
        }
        Some(jpeg_decoder::PixelFormat::CMYK32) => {
            return Ok(colour::cmyk_to_srgb(&pixels, w, h, icc.as_deref()).map(
                |(image, conversion)| {
                    log_ignored(conversion);
                    DynamicImage::ImageRgb8(image)
                },
            ));
        }
        _ => None,
    };
    Ok(image.map(|image| in_srgb(image, icc.as_deref())))
}

fn check_pixels(width: u32, height: u32, max_pixels: u64) -> Result<(), StepError> {
    let pixels = width as u64 * height as u64;
    if pixels > max_pixels {
        return Err(StepError::Unprocessable(format!(
            "image declares {width}x{height} = {pixels} pixels, over MEDIAONCE_MAX_PIXELS = {max_pixels}: refused before decoding"
        )));
    }
    Ok(())
}
