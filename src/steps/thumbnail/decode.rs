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
        Opened::Jpeg(jpeg) => Ok(decode_jpeg(jpeg, Scales::FULL)?.0),
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

/// An `image` decoder's error: the input's fault (permanent) when the
/// bytes are malformed, truncated (an I/O error reading from memory can
/// only be the data ending early), over a limit or of a kind this build
/// does not read; ours (retried) when the decoder was driven wrong.
fn undecodable(e: image::ImageError) -> StepError {
    use image::ImageError::*;
    match e {
        Decoding(_) | Unsupported(_) | Limits(_) | IoError(_) => {
            StepError::Unprocessable(format!("undecodable image: {e}"))
        }
        Parameter(_) | Encoding(_) => StepError::Failed(format!("decoding failed: {e}")),
    }
}

/// jpeg-decoder's error, sorted as `undecodable` sorts `image`'s: a
/// malformed, truncated or unsupported stream is the input's fault; an
/// internal error (its worker thread) is ours.
fn jpeg_failed(e: jpeg_decoder::Error) -> StepError {
    use jpeg_decoder::{Error, UnsupportedFeature};
    match e {
        Error::Unsupported(UnsupportedFeature::ArithmeticEntropyCoding) => {
            StepError::Unprocessable(
                "undecodable image: an arithmetic-coded JPEG, which this build does not decode \
                 (re-encode it with Huffman coding, e.g. `jpegtran -optimize`)"
                    .into(),
            )
        }
        Error::Format(_) | Error::Unsupported(_) | Error::Io(_) => {
            StepError::Unprocessable(format!("undecodable image: {e}"))
        }
        Error::Internal(_) => StepError::Failed(format!("decoding the JPEG failed: {e}")),
    }
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
/// need at most half its pixels is decoded at 1/2, 1/4 or 1/8 scale through
/// its DCT (libvips' shrink-on-load): less work, less memory. Anything else
/// is decoded in full.
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
    let (w, h) = upright((stored_w, stored_h), orientation);
    let plans = plan(w, h, params);
    let jpeg = match opened {
        Opened::Jpeg(jpeg) => jpeg,
        Opened::Other(header) => return Ok((decode_opened(header)?, plans)),
    };
    let subsampling = mediaonce_jpeg::subsampling(bytes).unwrap_or((1, 1));
    // An image of a few thousand pixels gains nothing by shrinking on
    // load, and its thumbnail of a pixel or two is the resize filter's
    // weighting of the decoded frame's few pixels: it is decoded whole.
    let scales = if stored_w as u64 * stored_h as u64 <= SMALL_IMAGE_PIXELS {
        Scales::FULL
    } else {
        Scales::for_plans(&plans, upright(subsampling, orientation))
    };
    let (image, eighths) = decode_jpeg(jpeg, scales)?;
    let shrink = Shrink::new((stored_w, stored_h), orientation, eighths);
    if (image.width(), image.height()) != shrink.frame {
        // Both decoders give libjpeg's frame; another size is a bug here,
        // not a fault of the input.
        return Err(StepError::Failed(format!(
            "the JPEG decoded to {}x{} at {eighths}/8 scale, not the {}x{} expected",
            image.width(),
            image.height(),
            shrink.frame.0,
            shrink.frame.1
        )));
    }
    let plans = plans
        .into_iter()
        .map(|p| Plan {
            crop: shrink.crop(p.crop),
            ..p
        })
        .collect();
    Ok((image, plans))
}

/// A pair of (across, down) values of the stored image (its size, its
/// subsampling), once it is turned upright.
fn upright<T>((x, y): (T, T), orientation: Orientation) -> (T, T) {
    if swaps_axes(orientation) {
        (y, x)
    } else {
        (x, y)
    }
}

/// The pixels at or under which a JPEG is decoded whole (64 × 64).
const SMALL_IMAGE_PIXELS: u64 = 4096;

/// The DCT scales, in eighths (1, 2, 4 or 8), a JPEG is decoded at for
/// its plans, by how its decoder brings a subsampled chroma to the luma's
/// size.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Scales {
    /// `mediaonce_jpeg::scaled`'s, for the files it reads: a half-rate
    /// chroma through an IDCT twice the luma's size (libjpeg's way), so
    /// it has as many samples as the luma.
    chroma_at_luma_size: u32,
    /// jpeg-decoder's, for the rest: chroma decoded at the luma's scale
    /// and upsampled after.
    chroma_upsampled: u32,
}

impl Scales {
    const FULL: Scales = Scales {
        chroma_at_luma_size: 8,
        chroma_upsampled: 8,
    };

    /// The scales for `plans` of a file whose coarsest component is
    /// `subsampling` times coarser than the luma on each axis
    /// (`mediaonce_jpeg::subsampling`), upright: the crops are upright and
    /// the scale is the same on both axes, so orientation only swaps the
    /// subsampling's axes.
    ///
    /// Decoded at the luma's size, a subsampled component has the luma's
    /// samples, and one an output pixel will do, as for the luma.
    /// Upsampled, a 4:2:0 file's chroma at 1/8 has half the luma's 1/8
    /// samples, and resized it is the blurred chroma of a smaller
    /// thumbnail, so such a scale must leave that component twice the
    /// output's samples: four luma samples an output pixel on that axis.
    fn for_plans(plans: &[Plan], subsampling: (usize, usize)) -> Scales {
        let upsampled = |ratio: usize| if ratio > 1 { 2 * ratio } else { 1 };
        Scales {
            chroma_at_luma_size: shrink_eighths(plans, (1, 1)),
            chroma_upsampled: shrink_eighths(
                plans,
                (upsampled(subsampling.0), upsampled(subsampling.1)),
            ),
        }
    }
}

/// The smallest DCT scale, in eighths (1, 2, 4 or 8), at which every plan's
/// crop still has `headroom` decoded samples an output pixel, across and
/// down: at least one, so that the resize after it only ever shrinks
/// (`Scales::for_plans` asks more of upsampled chroma).
fn shrink_eighths(plans: &[Plan], (across, down): (usize, usize)) -> u32 {
    [1, 2, 4]
        .into_iter()
        .find(|&eighths| {
            plans.iter().all(|p| {
                let (_, _, cw, ch) = p.crop;
                cw * eighths as f64 >= 8.0 * p.width as f64 * across as f64
                    && ch * eighths as f64 >= 8.0 * p.height as f64 * down as f64
            })
        })
        .unwrap_or(8)
}

/// The geometry of a JPEG decoded at `eighths`/8 through its DCT and then
/// turned upright: where the picture lies in the decoded frame, so that a
/// crop planned on the upright image at full size can be taken from it.
///
/// libjpeg's rule (jpeg-decoder and `mediaonce_jpeg::scaled` both follow it): each
/// side of the frame is the stored side × `eighths` / 8, rounded up. A
/// decoded pixel covers 8 / `eighths` source pixels on each axis, so the
/// picture fills `side × eighths / 8` pixels from the stored frame's top
/// left, and the last column and row are partly padding when the side is
/// not a multiple of 8 / `eighths` (a 3001-pixel row is 375.125 pixels of
/// picture in a 376-pixel row at 1/8). An orientation that mirrors an axis
/// puts that padding first, so the picture then starts past it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Shrink {
    /// The decoded frame, upright, in pixels.
    pub frame: (u32, u32),
    /// Where the picture starts in it (decoded pixels, upright).
    pub origin: (f64, f64),
    /// Decoded pixels per source pixel.
    pub scale: f64,
}

impl Shrink {
    pub fn new(stored: (u32, u32), orientation: Orientation, eighths: u32) -> Self {
        let scale = eighths as f64 / 8.0;
        let (fw, fh) = scaled_frame(stored, eighths);
        let (pw, ph) = (stored.0 as f64 * scale, stored.1 as f64 * scale);
        // The picture's two corners in the stored frame, turned upright
        // as `DynamicImage::apply_orientation` turns the pixels.
        let (fw_, fh_) = (fw as f64, fh as f64);
        let turn = |(x, y): (f64, f64)| -> (f64, f64) {
            match orientation {
                Orientation::NoTransforms => (x, y),
                Orientation::FlipHorizontal => (fw_ - x, y),
                Orientation::FlipVertical => (x, fh_ - y),
                Orientation::Rotate180 => (fw_ - x, fh_ - y),
                Orientation::Rotate90 => (fh_ - y, x),
                Orientation::Rotate270 => (y, fw_ - x),
                Orientation::Rotate90FlipH => (y, x),
                Orientation::Rotate270FlipH => (fh_ - y, fw_ - x),
            }
        };
        let (a, b) = (turn((0.0, 0.0)), turn((pw, ph)));
        Shrink {
            frame: upright((fw, fh), orientation),
            origin: (a.0.min(b.0), a.1.min(b.1)),
            scale,
        }
    }

    /// A crop planned on the upright image at full size (left, top, width,
    /// height), in the decoded frame's pixels.
    pub fn crop(&self, (x, y, w, h): (f64, f64, f64, f64)) -> (f64, f64, f64, f64) {
        let s = self.scale;
        (self.origin.0 + x * s, self.origin.1 + y * s, w * s, h * s)
    }
}

/// A stored frame's size at `eighths`/8: each side rounded up (libjpeg).
fn scaled_frame((w, h): (u32, u32), eighths: u32) -> (u32, u32) {
    ((w * eighths).div_ceil(8), (h * eighths).div_ceil(8))
}

/// The scale jpeg-decoder 0.3 picks when `Decoder::scale` is asked for
/// `requested`: the smallest whose frame reaches the request on *either*
/// axis (`idct::choose_idct_size`). For a frame with a side of a few
/// pixels that is smaller than asked on the other axis, so the caller
/// checks the pick before asking (`jpeg_decoder_scale_matches_the_prediction`
/// holds this to the crate).
fn jpeg_decoder_pick(stored: (u32, u32), requested: (u32, u32)) -> u32 {
    [1, 2, 4]
        .into_iter()
        .find(|&eighths| {
            let (w, h) = scaled_frame(stored, eighths);
            w >= requested.0 || h >= requested.1
        })
        .unwrap_or(8)
}

/// A JPEG at a reduced DCT scale, in sRGB and upright, and the scale it
/// was decoded at, in eighths. At 1/8, 1/4 or 1/2 only the coefficients
/// the scale needs are decoded, at `scales.chroma_at_luma_size`, when the
/// file is of the common shape (`mediaonce_jpeg::scaled`: in about half the time);
/// jpeg-decoder decodes the rest at `scales.chroma_upsampled`, or at 8
/// when it does not give that scale exactly. CMYK and YCCK come out as
/// inks and go through the image's CMYK profile (`colour::cmyk_to_srgb`).
fn decode_jpeg(header: Box<JpegHeader>, scales: Scales) -> Result<(DynamicImage, u32), StepError> {
    let JpegHeader {
        bytes,
        mut decoder,
        width,
        height,
        orientation,
    } = *header;
    let full = (width, height);
    let icc = decoder.icc_profile();
    let eighths = scales.chroma_at_luma_size;
    let scaled = (eighths < 8)
        .then(|| mediaonce_jpeg::scaled::decode(bytes, eighths as usize, full))
        .flatten()
        .filter(|s| (s.width, s.height) == scaled_frame(full, eighths));
    let (mut image, eighths) = if let Some(scaled) = scaled {
        let (w, h) = (scaled.width, scaled.height);
        let image = if scaled.grey {
            image::GrayImage::from_raw(w, h, scaled.pixels).map(DynamicImage::ImageLuma8)
        } else {
            image::RgbImage::from_raw(w, h, scaled.pixels).map(DynamicImage::ImageRgb8)
        };
        let image = image.ok_or_else(|| {
            StepError::Failed("mediaonce_jpeg::scaled returned a buffer of the wrong size".into())
        })?;
        (in_srgb(image, icc.as_deref()), eighths)
    } else {
        // jpeg-decoder decodes at full size unless asked; it is asked only
        // for a scale it will give as asked.
        let eighths = scales.chroma_upsampled;
        let frame = scaled_frame(full, eighths);
        let eighths = if eighths < 8 && jpeg_decoder_pick(full, frame) == eighths {
            let clamp = |n: u32| n.min(u16::MAX as u32) as u16;
            decoder
                .scale(clamp(frame.0), clamp(frame.1))
                .map_err(jpeg_failed)?;
            eighths
        } else {
            8
        };
        let (w, h) = scaled_frame(full, eighths);
        let pixels = decoder.decode().map_err(jpeg_failed)?;
        let format = decoder.info().map(|info| info.pixel_format);
        let length = pixels.len();
        let image = match format {
            Some(jpeg_decoder::PixelFormat::RGB24) => image::RgbImage::from_raw(w, h, pixels)
                .map(|image| in_srgb(DynamicImage::ImageRgb8(image), icc.as_deref())),
            Some(jpeg_decoder::PixelFormat::L8) => image::GrayImage::from_raw(w, h, pixels)
                .map(|image| in_srgb(DynamicImage::ImageLuma8(image), icc.as_deref())),
            Some(jpeg_decoder::PixelFormat::CMYK32) => {
                colour::cmyk_to_srgb(&pixels, w, h, icc.as_deref()).map(|(image, conversion)| {
                    log_ignored(conversion);
                    DynamicImage::ImageRgb8(image)
                })
            }
            _ => {
                return Err(StepError::Unprocessable(
                    "undecodable image: a JPEG of 16-bit samples, which this build does not read"
                        .into(),
                ))
            }
        };
        let image = image.ok_or_else(|| {
            StepError::Failed(format!(
                "jpeg-decoder returned {length} bytes for a {w}x{h} {format:?} frame"
            ))
        })?;
        (image, eighths)
    };
    image.apply_orientation(orientation);
    Ok((image, eighths))
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

#[cfg(test)]
mod tests {
    use super::super::{render, Format};
    use super::*;
    use serde_json::json;

    const ORIENTATIONS: [Orientation; 8] = [
        Orientation::NoTransforms,
        Orientation::Rotate90,
        Orientation::Rotate180,
        Orientation::Rotate270,
        Orientation::FlipHorizontal,
        Orientation::FlipVertical,
        Orientation::Rotate90FlipH,
        Orientation::Rotate270FlipH,
    ];

    /// For any stored size, orientation, subsampling and target, the scale
    /// picked keeps every output a shrink, and every planned crop, taken
    /// into the decoded frame, lies inside it (a seeded loop over 200,000
    /// cases, the sizes of the failures among them).
    #[test]
    fn every_planned_crop_lies_inside_the_decoded_frame() {
        let mut rng = fastrand::Rng::with_seed(23);
        let samplings = [(1, 1), (2, 2), (2, 1), (1, 2), (4, 1), (1, 4)];
        let fixed = [
            (1179, 2556),
            (3001, 2000),
            (3001, 1999),
            (1001, 667),
            (1, 1),
            (7, 3),
        ];
        for case in 0..200_000 {
            let stored = match fixed.get(case % 50) {
                Some(&size) => size,
                None => (rng.u32(1..6000), rng.u32(1..6000)),
            };
            let orientation = ORIENTATIONS[rng.usize(..8)];
            let subsampling = samplings[rng.usize(..samplings.len())];
            let params = match rng.u8(..3) {
                0 => json!({ "widths": [rng.u32(1..3000)] }),
                1 => {
                    json!({ "width": rng.u32(1..3000), "height": rng.u32(1..3000), "fit": "cover" })
                }
                _ => json!({ "width": rng.u32(1..3000), "height": rng.u32(1..3000) }),
            };
            let params = ThumbnailParams::parse(params.as_object().unwrap()).unwrap();
            let (w, h) = upright(stored, orientation);
            let plans = plan(w, h, &params);
            let scales = Scales::for_plans(&plans, upright(subsampling, orientation));
            assert!(scales.chroma_at_luma_size <= scales.chroma_upsampled);
            for eighths in [scales.chroma_at_luma_size, scales.chroma_upsampled] {
                let shrink = Shrink::new(stored, orientation, eighths);
                assert_eq!(
                    shrink.frame,
                    upright(scaled_frame(stored, eighths), orientation)
                );
                for p in &plans {
                    let (x, y, cw, ch) = shrink.crop(p.crop);
                    let case = format!(
                        "{stored:?} {orientation:?} {subsampling:?} {params:?} at {eighths}/8: {:?}",
                        (x, y, cw, ch)
                    );
                    assert!(x >= 0.0 && y >= 0.0, "{case}");
                    assert!(x + cw <= shrink.frame.0 as f64, "{case}");
                    assert!(y + ch <= shrink.frame.1 as f64, "{case}");
                    if eighths < 8 {
                        assert!(cw >= p.width as f64 && ch >= p.height as f64, "{case}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_mirrored_axis_starts_past_the_frames_padding() {
        // 3001 × 2000 at 1/8: a 376 × 250 frame holding 375.125 × 250.
        let plain = Shrink::new((3001, 2000), Orientation::NoTransforms, 1);
        assert_eq!((plain.frame, plain.origin), ((376, 250), (0.0, 0.0)));
        let mirrored = Shrink::new((3001, 2000), Orientation::FlipHorizontal, 1);
        assert_eq!(mirrored.origin, (0.875, 0.0));
        // Turned a quarter clockwise, the stored left column is the top
        // row, and the stored bottom row (no padding there) the left.
        let turned = Shrink::new((3001, 1999), Orientation::Rotate90, 1);
        assert_eq!(turned.frame, (250, 376));
        assert_eq!(turned.origin, (0.125, 0.0));
        assert_eq!(
            turned.crop((0.0, 0.0, 1999.0, 3001.0)),
            (0.125, 0.0, 249.875, 375.125)
        );
    }

    /// `jpeg_decoder_pick` is jpeg-decoder's own choice, on frames with
    /// sides of a few pixels where its either-axis rule bites.
    #[test]
    fn jpeg_decoder_scale_matches_the_prediction() {
        for (w, h) in [
            (1, 1),
            (3, 100),
            (100, 3),
            (9, 17),
            (17, 9),
            (8, 64),
            (250, 7),
        ] {
            let pixels = vec![128u8; (w * h * 3) as usize];
            let mut jpeg = Vec::new();
            jpeg_encoder::Encoder::new(&mut jpeg, 90)
                .encode(&pixels, w as u16, h as u16, jpeg_encoder::ColorType::Rgb)
                .unwrap();
            for eighths in [1, 2, 4] {
                let asked = scaled_frame((w, h), eighths);
                let mut decoder = jpeg_decoder::Decoder::new(Cursor::new(&jpeg[..]));
                decoder.read_info().unwrap();
                let (gw, gh) = decoder.scale(asked.0 as u16, asked.1 as u16).unwrap();
                let picked = jpeg_decoder_pick((w, h), asked);
                assert_eq!(
                    (gw as u32, gh as u32),
                    scaled_frame((w, h), picked),
                    "{w}x{h} asked at {eighths}/8"
                );
            }
        }
    }

    /// A JPEG of a wave whose period is a few output pixels, in every
    /// orientation: the thumbnail shrunk on load is the thumbnail of the
    /// full decode (a crop off by the frame's padding, 7 source pixels at
    /// 1/8, would put the wave out of phase).
    #[test]
    fn shrink_on_load_agrees_with_a_full_decode_in_every_orientation() {
        let (w, h) = (1001u32, 667u32);
        let wave = |t: u32| (128.0 + 100.0 * (t as f64 * std::f64::consts::TAU / 97.0).sin()) as u8;
        let mut pixels = Vec::with_capacity((w * h * 3) as usize);
        for y in 0..h {
            for x in 0..w {
                pixels.extend_from_slice(&[wave(x), wave(y), wave(x + y)]);
            }
        }
        let mut jpeg = Vec::new();
        let mut encoder = jpeg_encoder::Encoder::new(&mut jpeg, 95);
        encoder.set_sampling_factor(jpeg_encoder::SamplingFactor::F_1_1);
        encoder
            .encode(&pixels, w as u16, h as u16, jpeg_encoder::ColorType::Rgb)
            .unwrap();
        for orientation in 1..=8u16 {
            let file = super::super::tests::with_exif_orientation(&jpeg, orientation);
            let params =
                ThumbnailParams::parse(json!({"widths": [60]}).as_object().unwrap()).unwrap();
            let (small, plans) = decode_for(&file, 1 << 24, &params).unwrap();
            assert!(small.width() < 200, "{orientation}: shrunk on load");
            let shrunk = render(&small, &plans[0], Format::Png).unwrap().to_rgb8();
            let full = decode(&file, 1 << 24).unwrap();
            let full_plan = plan(full.width(), full.height(), &params)[0];
            let reference = render(&full, &full_plan, Format::Png).unwrap().to_rgb8();
            assert_eq!(shrunk.dimensions(), reference.dimensions(), "{orientation}");
            let mean = shrunk
                .as_raw()
                .iter()
                .zip(reference.as_raw())
                .map(|(a, b)| a.abs_diff(*b) as f64)
                .sum::<f64>()
                / shrunk.as_raw().len() as f64;
            assert!(
                mean < 3.0,
                "orientation {orientation}: mean difference {mean}"
            );
        }
    }

    /// A 4:2:0 file that `mediaonce_jpeg::scaled` reads is decoded at the
    /// scale its luma needs, its chroma brought to the luma's size by its
    /// IDCT; one it leaves to jpeg-decoder (progressive, here) at the
    /// larger scale that leaves the upsampled chroma twice the output's
    /// samples; a 4:4:4 file at the luma's scale either way.
    #[test]
    fn subsampled_chroma_sets_the_scale_only_where_it_is_upsampled() {
        let (w, h) = (1000u16, 800u16);
        let pixels: Vec<u8> = (0..w as usize * h as usize * 3)
            .map(|i| ((i * 7) % 251) as u8)
            .collect();
        let jpeg = |factor, progressive| {
            let mut out = Vec::new();
            let mut encoder = jpeg_encoder::Encoder::new(&mut out, 90);
            encoder.set_sampling_factor(factor);
            encoder.set_progressive(progressive);
            encoder
                .encode(&pixels, w, h, jpeg_encoder::ColorType::Rgb)
                .unwrap();
            out
        };
        let params = ThumbnailParams::parse(json!({"widths": [120]}).as_object().unwrap()).unwrap();
        for (factor, progressive, decoded) in [
            (jpeg_encoder::SamplingFactor::R_4_2_0, false, 125),
            (jpeg_encoder::SamplingFactor::R_4_2_0, true, 500),
            (jpeg_encoder::SamplingFactor::R_4_4_4, false, 125),
            (jpeg_encoder::SamplingFactor::R_4_4_4, true, 125),
        ] {
            let (image, plans) = decode_for(&jpeg(factor, progressive), 1 << 24, &params).unwrap();
            assert_eq!(
                image.width(),
                decoded,
                "{factor:?}, progressive {progressive}"
            );
            let thumbnail = render(&image, &plans[0], Format::Png).unwrap();
            assert_eq!(thumbnail.width(), 120);
        }
    }

    #[test]
    fn the_subsampling_is_read_from_any_frame_header() {
        let pixels = vec![90u8; 64 * 48 * 3];
        for (factor, progressive, want) in [
            (jpeg_encoder::SamplingFactor::F_2_2, false, (2, 2)),
            (jpeg_encoder::SamplingFactor::F_4_1, false, (4, 1)),
            (jpeg_encoder::SamplingFactor::F_1_2, true, (1, 2)),
            (jpeg_encoder::SamplingFactor::F_1_1, true, (1, 1)),
        ] {
            let mut jpeg = Vec::new();
            let mut encoder = jpeg_encoder::Encoder::new(&mut jpeg, 90);
            encoder.set_sampling_factor(factor);
            encoder.set_progressive(progressive);
            encoder
                .encode(&pixels, 64, 48, jpeg_encoder::ColorType::Rgb)
                .unwrap();
            assert_eq!(mediaonce_jpeg::subsampling(&jpeg), Some(want), "{factor:?}");
        }
        assert_eq!(mediaonce_jpeg::subsampling(b"not a jpeg"), None);
    }

    /// The input's faults are permanent, ours are retried (DESIGN.md
    /// "Which failures are the input's").
    #[test]
    fn decode_errors_are_sorted_into_the_inputs_and_ours() {
        use image::error::{ParameterError, ParameterErrorKind};
        use jpeg_decoder::{Error, UnsupportedFeature};
        let arithmetic = jpeg_failed(Error::Unsupported(
            UnsupportedFeature::ArithmeticEntropyCoding,
        ));
        assert!(arithmetic.is_permanent());
        assert!(
            arithmetic.to_string().contains("arithmetic-coded"),
            "{arithmetic}"
        );
        assert!(jpeg_failed(Error::Format("bad marker".into())).is_permanent());
        let eof = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
        assert!(jpeg_failed(Error::Io(eof)).is_permanent());
        assert!(!jpeg_failed(Error::Internal("worker gone".into())).is_permanent());
        let misuse = image::ImageError::Parameter(ParameterError::from_kind(
            ParameterErrorKind::DimensionMismatch,
        ));
        assert!(!undecodable(misuse).is_permanent());
        // A cut-short JPEG and junk are the input's.
        let mut jpeg = Vec::new();
        jpeg_encoder::Encoder::new(&mut jpeg, 90)
            .encode(&[7u8; 48 * 32 * 3], 48, 32, jpeg_encoder::ColorType::Rgb)
            .unwrap();
        for bad in [
            &jpeg[..jpeg.len() / 2],
            &jpeg[..200],
            b"\xFF\xD8\xFF junk".as_slice(),
        ] {
            let error = decode(bad, 1 << 20).expect_err("undecodable");
            assert!(error.is_permanent(), "{error:?}");
        }
    }
}
