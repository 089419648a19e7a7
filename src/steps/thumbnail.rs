//! `thumbnail`: resized copies of an image, deterministic to the byte.
//!
//! Decodes JPEG, PNG, WebP, GIF (the first frame) and TIFF with the `image`
//! crate (zune-jpeg for JPEG; a JPEG much larger than its outputs is decoded
//! at reduced scale by `jpeg-decoder`), honours EXIF orientation, checks the declared
//! dimensions against `MEDIAONCE_MAX_PIXELS` before decoding a pixel (a
//! decompression bomb fails the job, and counts towards the attempts cap),
//! resizes with `fast_image_resize` (SIMD convolution, Lanczos3, alpha
//! premultiplied), and encodes JPEG (`image`), PNG (`image`) or lossy WebP
//! (libwebp through the `webp` crate; `image` only writes lossless WebP).
//!
//! Params:
//! - `widths`: target widths, e.g. `[320, 1280]`, aspect ratio kept; or
//!   `width` and `height` with `fit`: `contain` (inside the box) or `cover`
//!   (fills the box, centre-cropped);
//! - `format`: `jpeg` (default), `png` or `webp`; `quality`: 1 to 100 for
//!   jpeg and webp (default 82);
//! - `upscale`: false by default: an image smaller than the target keeps its
//!   size.
//!
//! Outputs are named by the requested width: `thumb-<width>.<jpg|png|webp>`,
//! so a reader knows the paths from the recipe alone.

use std::io::Cursor;

use fast_image_resize::images::{TypedImage, TypedImageRef};
use fast_image_resize::pixels::{U8x3, U8x4};
use fast_image_resize::{FilterType, PixelTrait, ResizeAlg, ResizeOptions, Resizer};
use image::metadata::Orientation;
use image::{DynamicImage, ImageDecoder, ImageReader};
use serde_json::{Map, Value};

use crate::step::{InputUse, JobOutputs, Step, StepContext, StepError};

/// Images declaring more pixels than this are refused before decoding.
pub const ENV_MAX_PIXELS: &str = "MEDIAONCE_MAX_PIXELS";
/// 100 megapixels.
pub const DEFAULT_MAX_PIXELS: u64 = 100_000_000;

/// Inputs larger than this are refused before reading (bytes).
pub const MAX_INPUT_BYTES: u64 = 512 * 1024 * 1024;

/// The step, with the pixel limit images are checked against before
/// decoding (`MEDIAONCE_MAX_PIXELS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thumbnail {
    pub max_pixels: u64,
}

impl Thumbnail {
    /// The step with `MEDIAONCE_MAX_PIXELS` read through `lookup`. A value
    /// that is not a positive integer takes the default here; the
    /// configuration, read through the same lookup, refuses it at start-up.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let max_pixels =
            max_pixels(lookup(ENV_MAX_PIXELS).as_deref()).unwrap_or(DEFAULT_MAX_PIXELS);
        Thumbnail { max_pixels }
    }
}

/// `MEDIAONCE_MAX_PIXELS` as written (`None` or blank: the default): a
/// positive integer, or the problem with it. The step and the
/// configuration's start-up check read it here, the same way.
pub fn max_pixels(text: Option<&str>) -> Result<u64, String> {
    match text.map(str::trim).filter(|t| !t.is_empty()) {
        None => Ok(DEFAULT_MAX_PIXELS),
        Some(text) => match text.parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("must be a positive integer, got {text:?}")),
        },
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Jpeg,
    Png,
    Webp,
}

impl Format {
    fn extension(self) -> &'static str {
        match self {
            Format::Jpeg => "jpg",
            Format::Png => "png",
            Format::Webp => "webp",
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            Format::Jpeg => "image/jpeg",
            Format::Png => "image/png",
            Format::Webp => "image/webp",
        }
    }

    fn has_alpha(self) -> bool {
        !matches!(self, Format::Jpeg)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    Contain,
    Cover,
}

/// What to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Widths(Vec<u32>),
    Box { width: u32, height: u32, fit: Fit },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThumbnailParams {
    pub target: Target,
    pub format: Format,
    pub quality: u8,
    /// JPEG only: a progressive scan script instead of one baseline scan.
    pub progressive: bool,
    pub upscale: bool,
}

/// How outputs are encoded: the params' format, quality and scan order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoding {
    pub format: Format,
    pub quality: u8,
    pub progressive: bool,
}

impl ThumbnailParams {
    pub fn encoding(&self) -> Encoding {
        Encoding {
            format: self.format,
            quality: self.quality,
            progressive: self.progressive,
        }
    }
}

fn positive_u32(params: &Map<String, Value>, name: &str) -> Result<Option<u32>, String> {
    match params.get(name) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|n| (1..=65_535).contains(n))
            .map(|n| Some(n as u32))
            .ok_or_else(|| format!("{name} must be an integer from 1 to 65535, got {v}")),
    }
}

impl ThumbnailParams {
    /// Reads and checks the params, naming the one that is wrong. Pure.
    pub fn parse(params: &Map<String, Value>) -> Result<Self, String> {
        if let Some(unknown) = params.keys().find(|k| {
            !matches!(
                k.as_str(),
                "widths"
                    | "width"
                    | "height"
                    | "fit"
                    | "format"
                    | "quality"
                    | "progressive"
                    | "upscale"
            )
        }) {
            return Err(format!(
                "unknown param {unknown:?} (expected widths, or width/height/fit; format, quality, progressive, upscale)"
            ));
        }
        let target = match (
            params.get("widths"),
            positive_u32(params, "width")?,
            positive_u32(params, "height")?,
        ) {
            (Some(widths), None, None) => {
                let list = widths
                    .as_array()
                    .filter(|a| !a.is_empty())
                    .ok_or("widths must be a non-empty array")?;
                let widths = list
                    .iter()
                    .map(|w| {
                        w.as_u64()
                            .filter(|n| (1..=65_535).contains(n))
                            .map(|n| n as u32)
                    })
                    .collect::<Option<Vec<u32>>>()
                    .ok_or_else(|| {
                        format!("widths must hold integers from 1 to 65535, got {widths}")
                    })?;
                let mut unique = widths.clone();
                unique.sort_unstable();
                unique.dedup();
                if unique.len() != widths.len() {
                    return Err(format!("widths must not repeat, got {widths:?}"));
                }
                Target::Widths(widths)
            }
            (None, Some(width), Some(height)) => {
                let fit = match params.get("fit").map(|f| f.as_str()) {
                    None | Some(Some("contain")) => Fit::Contain,
                    Some(Some("cover")) => Fit::Cover,
                    Some(_) => {
                        return Err(format!(
                            "fit must be \"contain\" or \"cover\", got {}",
                            params["fit"]
                        ))
                    }
                };
                Target::Box { width, height, fit }
            }
            (Some(_), _, _) => return Err("give widths, or width and height, not both".into()),
            _ => return Err("give widths (e.g. [320, 1280]), or width and height".into()),
        };
        if params.contains_key("fit") && matches!(target, Target::Widths(_)) {
            return Err("fit goes with width and height, not widths".into());
        }
        let format = match params.get("format").map(|f| f.as_str()) {
            None | Some(Some("jpeg")) => Format::Jpeg,
            Some(Some("png")) => Format::Png,
            Some(Some("webp")) => Format::Webp,
            Some(_) => {
                return Err(format!(
                    "format must be \"jpeg\", \"png\" or \"webp\", got {}",
                    params["format"]
                ))
            }
        };
        let quality = match params.get("quality") {
            None => 82,
            Some(q) => q
                .as_u64()
                .filter(|n| (1..=100).contains(n))
                .map(|n| n as u8)
                .ok_or_else(|| format!("quality must be an integer from 1 to 100, got {q}"))?,
        };
        if params.contains_key("quality") && format == Format::Png {
            return Err("quality applies to jpeg and webp, not png".into());
        }
        let progressive = match params.get("progressive") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => return Err(format!("progressive must be true or false, got {other}")),
        };
        if params.contains_key("progressive") && format != Format::Jpeg {
            return Err("progressive applies to jpeg only".into());
        }
        let upscale = match params.get("upscale") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => return Err(format!("upscale must be true or false, got {other}")),
        };
        Ok(ThumbnailParams {
            target,
            format,
            quality,
            progressive,
            upscale,
        })
    }
}

/// One output to make: its name's width, its pixel size, and the source
/// rectangle (left, top, width, height) it is resized from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    pub name_width: u32,
    pub width: u32,
    pub height: u32,
    pub crop: (f64, f64, f64, f64),
}

fn scaled(length: u32, scale: f64) -> u32 {
    ((length as f64 * scale).round() as u32).max(1)
}

/// The outputs for a source of `src_w` × `src_h`. Pure.
pub fn plan(src_w: u32, src_h: u32, params: &ThumbnailParams) -> Vec<Plan> {
    let whole = (0.0, 0.0, src_w as f64, src_h as f64);
    let cap = |scale: f64| {
        if params.upscale {
            scale
        } else {
            scale.min(1.0)
        }
    };
    match &params.target {
        Target::Widths(widths) => widths
            .iter()
            .map(|&w| {
                let scale = cap(w as f64 / src_w as f64);
                Plan {
                    name_width: w,
                    width: scaled(src_w, scale),
                    height: scaled(src_h, scale),
                    crop: whole,
                }
            })
            .collect(),
        Target::Box { width, height, fit } => {
            let (bw, bh) = (*width as f64, *height as f64);
            let (sw, sh) = (src_w as f64, src_h as f64);
            let plan = match fit {
                Fit::Contain => {
                    let scale = cap((bw / sw).min(bh / sh));
                    Plan {
                        name_width: *width,
                        width: scaled(src_w, scale),
                        height: scaled(src_h, scale),
                        crop: whole,
                    }
                }
                Fit::Cover => {
                    let scale = cap((bw / sw).max(bh / sh));
                    // The box in source pixels, centred, no larger than the source.
                    let (cw, ch) = ((bw / scale).min(sw), (bh / scale).min(sh));
                    Plan {
                        name_width: *width,
                        width: ((cw * scale).round() as u32).max(1),
                        height: ((ch * scale).round() as u32).max(1),
                        crop: ((sw - cw) / 2.0, (sh - ch) / 2.0, cw, ch),
                    }
                }
            };
            vec![plan]
        }
    }
}

/// Decodes an image, refusing one whose declared size is over `max_pixels`
/// before decoding it, and turns it upright by its EXIF orientation.
pub fn decode(bytes: &[u8], max_pixels: u64) -> Result<DynamicImage, StepError> {
    let undecodable =
        |e: image::ImageError| StepError::Unprocessable(format!("undecodable image: {e}"));
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| StepError::Unprocessable(format!("undecodable image: {e}")))?;
    if reader.format().is_none() {
        return Err(StepError::Unprocessable(
            "undecodable image: not JPEG, PNG, WebP, GIF or TIFF".into(),
        ));
    }
    let mut decoder = reader.into_decoder().map_err(undecodable)?;
    let (width, height) = decoder.dimensions();
    check_pixels(width, height, max_pixels)?;
    let orientation = decoder.orientation().map_err(undecodable)?;
    let mut image = DynamicImage::from_decoder(decoder).map_err(undecodable)?;
    image.apply_orientation(orientation);
    Ok(image)
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
/// DCT (libvips' shrink-on-load): less work, less memory. Anything else, or
/// a JPEG that cannot be scaled (CMYK, 16-bit), is decoded in full.
pub fn decode_for(
    bytes: &[u8],
    max_pixels: u64,
    params: &ThumbnailParams,
) -> Result<(DynamicImage, Vec<Plan>), StepError> {
    let undecodable =
        |e: image::ImageError| StepError::Unprocessable(format!("undecodable image: {e}"));
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| StepError::Unprocessable(format!("undecodable image: {e}")))?;
    let format = reader.format();
    let mut header = reader.into_decoder().map_err(undecodable)?;
    let (stored_w, stored_h) = header.dimensions();
    check_pixels(stored_w, stored_h, max_pixels)?;
    let orientation = header.orientation().map_err(undecodable)?;
    drop(header);
    let (w, h) = if swaps_axes(orientation) {
        (stored_h, stored_w)
    } else {
        (stored_w, stored_h)
    };
    let plans = plan(w, h, params);
    if format == Some(image::ImageFormat::Jpeg) {
        // The smallest decoded size that still gives every output its pixels.
        let need =
            |out: u32, crop: f64, whole: u32| ((out as f64) * whole as f64 / crop).ceil() as u32;
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
        if need_w.saturating_mul(2) <= stored_w && need_h.saturating_mul(2) <= stored_h {
            if let Some(mut image) = decode_jpeg_scaled(bytes, need_w, need_h)? {
                image.apply_orientation(orientation);
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
                return Ok((image, plans));
            }
        }
    }
    Ok((decode(bytes, max_pixels)?, plans))
}

/// A JPEG decoded through its DCT at the smallest scale (1/8, 1/4, 1/2)
/// that is at least `need_w` × `need_h`; `None` when it cannot be.
fn decode_jpeg_scaled(
    bytes: &[u8],
    need_w: u32,
    need_h: u32,
) -> Result<Option<DynamicImage>, StepError> {
    let failed =
        |e: jpeg_decoder::Error| StepError::Unprocessable(format!("undecodable image: {e}"));
    let mut decoder = jpeg_decoder::Decoder::new(Cursor::new(bytes));
    let clamp = |n: u32| n.clamp(1, u16::MAX as u32) as u16;
    let (w, h) = decoder
        .scale(clamp(need_w), clamp(need_h))
        .map_err(failed)?;
    let (w, h) = (w as u32, h as u32);
    if w < need_w || h < need_h {
        return Ok(None);
    }
    let pixels = decoder.decode().map_err(failed)?;
    let format = decoder.info().map(|info| info.pixel_format);
    Ok(match format {
        Some(jpeg_decoder::PixelFormat::RGB24) => {
            image::RgbImage::from_raw(w, h, pixels).map(DynamicImage::ImageRgb8)
        }
        Some(jpeg_decoder::PixelFormat::L8) => {
            image::GrayImage::from_raw(w, h, pixels).map(DynamicImage::ImageLuma8)
        }
        _ => None,
    })
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

/// Resizes to one plan, keeping alpha when the format has it (JPEG gets the
/// image over white).
pub fn render(
    image: &DynamicImage,
    plan: &Plan,
    format: Format,
) -> Result<DynamicImage, StepError> {
    let source = if format.has_alpha() && image.color().has_alpha() {
        DynamicImage::ImageRgba8(image.to_rgba8())
    } else if image.color().has_alpha() {
        DynamicImage::ImageRgb8(over_white(image))
    } else {
        DynamicImage::ImageRgb8(image.to_rgb8())
    };
    let (left, top, width, height) = plan.crop;
    let options = ResizeOptions::new()
        .resize_alg(ResizeAlg::Convolution(FilterType::Lanczos3))
        .crop(left, top, width, height);
    // Typed to the two pixel formats resized (RGB and RGBA, 8 bits): the
    // resizer's code for every other pixel type stays out of the binary.
    let failed = |e: &dyn std::fmt::Display| StepError::Failed(format!("resizing failed: {e}"));
    Ok(match source {
        DynamicImage::ImageRgba8(rgba) => {
            let mut target = image::RgbaImage::new(plan.width, plan.height);
            resize_typed::<U8x4>(
                &rgba,
                rgba.width(),
                rgba.height(),
                &mut target,
                plan,
                &options,
            )
            .map_err(|e| failed(&e))?;
            DynamicImage::ImageRgba8(target)
        }
        DynamicImage::ImageRgb8(rgb) => {
            let mut target = image::RgbImage::new(plan.width, plan.height);
            resize_typed::<U8x3>(&rgb, rgb.width(), rgb.height(), &mut target, plan, &options)
                .map_err(|e| failed(&e))?;
            DynamicImage::ImageRgb8(target)
        }
        _ => unreachable!("the source is made RGB or RGBA above"),
    })
}

/// Resizes `source` (`width`×`height` pixels of `P`) into `target`, the
/// plan's size.
fn resize_typed<P>(
    source: &[u8],
    width: u32,
    height: u32,
    target: &mut [u8],
    plan: &Plan,
    options: &ResizeOptions,
) -> Result<(), String>
where
    P: PixelTrait,
{
    let source =
        TypedImageRef::<P>::from_buffer(width, height, source).map_err(|e| e.to_string())?;
    let mut target =
        TypedImage::<P>::from_buffer(plan.width, plan.height, target).map_err(|e| e.to_string())?;
    Resizer::new()
        .resize_typed(&source, &mut target, options)
        .map_err(|e| e.to_string())
}

fn over_white(image: &DynamicImage) -> image::RgbImage {
    let rgba = image.to_rgba8();
    image::RgbImage::from_fn(rgba.width(), rgba.height(), |x, y| {
        let [r, g, b, a] = rgba.get_pixel(x, y).0;
        let blend = |c: u8| ((c as u32 * a as u32 + 255 * (255 - a as u32) + 127) / 255) as u8;
        image::Rgb([blend(r), blend(g), blend(b)])
    })
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
            let memory = match image {
                DynamicImage::ImageRgba8(rgba) => {
                    webp::Encoder::from_rgba(rgba.as_raw(), w, h).encode(quality as f32)
                }
                other => {
                    webp::Encoder::from_rgb(other.to_rgb8().as_raw(), w, h).encode(quality as f32)
                }
            };
            out.extend_from_slice(&memory);
        }
    }
    Ok(out)
}

/// JPEG as web encoders write it: 4:2:0 chroma below quality 90 (libjpeg's
/// and libvips' threshold; 4:4:4 at 90 and above), chroma averaged over each
/// 2×2 block as libjpeg does (not its top-left pixel), one interleaved
/// baseline scan (or progressive on request), and the Annex K quantisation
/// tables that libjpeg, libvips and ImageMagick scale by the same quality
/// number. Of jpeg-encoder's tables, Annex K gave the most SSIM per byte
/// on bench/thumbnail.sh's input (ImageMagick's and the MS-SSIM-tuned ones
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
    let mut encoder = Encoder::new(out, quality);
    encoder.set_sampling_factor(if quality < 90 {
        SamplingFactor::R_4_2_0
    } else {
        SamplingFactor::R_4_4_4
    });
    encoder.set_chroma_subsampling_method(ChromaSubsamplingMethod::Average);
    encoder.set_quantization_tables(JPEG_TABLES, JPEG_TABLES);
    // Not optimised: jpeg-encoder writes optimised tables with one scan per
    // component, and zune-jpeg (the `image` crate's JPEG decoder, 0.5.15)
    // misreads such 4:2:0 files (SSIM 0.24 against libjpeg-turbo's decode
    // of the same bytes). Browsers would cope; Rust services would not.
    // One interleaved scan costs ~6% in bytes at 320 px.
    encoder.set_progressive(progressive);
    encoder
        .encode(rgb.as_raw(), w, h, ColorType::Rgb)
        .map_err(|e| StepError::Failed(format!("encoding failed: {e}")))
}

/// The quantisation tables JPEG outputs use (see `encode_jpeg`).
const JPEG_TABLES: jpeg_encoder::QuantizationTableType =
    jpeg_encoder::QuantizationTableType::Default;

#[async_trait::async_trait]
impl Step for Thumbnail {
    fn name(&self) -> &'static str {
        "thumbnail"
    }

    type Params = ThumbnailParams;

    fn params(&self, params: &Map<String, Value>) -> Result<ThumbnailParams, String> {
        ThumbnailParams::parse(params)
    }

    fn input_use(&self, _params: &ThumbnailParams) -> InputUse {
        InputUse::Memory {
            max_bytes: MAX_INPUT_BYTES,
        }
    }

    async fn run(
        &self,
        params: &ThumbnailParams,
        context: &StepContext<'_>,
        outputs: &mut JobOutputs,
    ) -> Result<(), StepError> {
        let params = params.clone();
        let input = context.input;
        if input.head.size > MAX_INPUT_BYTES {
            return Err(StepError::Unprocessable(format!(
                "the image is {} bytes, over the {MAX_INPUT_BYTES} this step reads",
                input.head.size
            )));
        }
        let bytes = input.bytes().await?;
        let (max_pixels, format) = (self.max_pixels, params.format);
        // Decoding and resizing are CPU work: off the async runtime's threads.
        let rendered =
            tokio::task::spawn_blocking(move || -> Result<Vec<(u32, Vec<u8>)>, StepError> {
                let image = decode(&bytes, max_pixels)?;
                plan(image.width(), image.height(), &params)
                    .iter()
                    .map(|p| {
                        Ok((
                            p.name_width,
                            encode(&render(&image, p, format)?, params.encoding())?,
                        ))
                    })
                    .collect()
            })
            .await
            .map_err(|e| StepError::Failed(format!("thumbnail task failed: {e}")))??;
        for (name_width, bytes) in rendered {
            let name = format!("thumb-{name_width}.{}", format.extension());
            outputs
                .put_bytes(&name, format.content_type(), bytes)
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{ImageEncoder, Rgba, RgbaImage};
    use serde_json::json;

    /// Red, green, blue and white corners, so orientation shows.
    fn corners(w: u32, h: u32, alpha: u8) -> RgbaImage {
        RgbaImage::from_fn(w, h, |x, y| match (x < w / 2, y < h / 2) {
            (true, true) => Rgba([255, 0, 0, alpha]),
            (false, true) => Rgba([0, 255, 0, alpha]),
            (true, false) => Rgba([0, 0, 255, alpha]),
            (false, false) => Rgba([255, 255, 255, alpha]),
        })
    }

    fn encoded(image: &RgbaImage, format: image::ImageFormat) -> Vec<u8> {
        let mut out = Cursor::new(Vec::new());
        let dynamic = if format == image::ImageFormat::Jpeg {
            DynamicImage::ImageRgb8(DynamicImage::ImageRgba8(image.clone()).to_rgb8())
        } else {
            DynamicImage::ImageRgba8(image.clone())
        };
        dynamic.write_to(&mut out, format).unwrap();
        out.into_inner()
    }

    /// A JPEG with an EXIF APP1 segment holding only Orientation.
    fn jpeg_with_orientation(image: &RgbaImage, orientation: u16) -> Vec<u8> {
        let jpeg = encoded(image, image::ImageFormat::Jpeg);
        let mut tiff = b"MM\0\x2a\0\0\0\x08\0\x01\x01\x12\0\x03\0\0\0\x01".to_vec();
        tiff.extend_from_slice(&orientation.to_be_bytes());
        tiff.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        let mut app1 = b"Exif\0\0".to_vec();
        app1.extend_from_slice(&tiff);
        let mut out = jpeg[..2].to_vec();
        out.extend_from_slice(&[0xFF, 0xE1]);
        out.extend_from_slice(&((app1.len() + 2) as u16).to_be_bytes());
        out.extend_from_slice(&app1);
        out.extend_from_slice(&jpeg[2..]);
        out
    }

    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= b as u32;
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    fn chunk(png: &mut Vec<u8>, kind: &[u8], data: &[u8]) {
        let mut body = kind.to_vec();
        body.extend_from_slice(data);
        png.extend_from_slice(&(data.len() as u32).to_be_bytes());
        png.extend_from_slice(&body);
        png.extend_from_slice(&crc32(&body).to_be_bytes());
    }

    /// A PNG that declares `w` × `h` and holds almost nothing.
    fn png_bomb(w: u32, h: u32) -> Vec<u8> {
        let mut ihdr = w.to_be_bytes().to_vec();
        ihdr.extend_from_slice(&h.to_be_bytes());
        ihdr.extend_from_slice(&[8, 6, 0, 0, 0]);
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        chunk(&mut png, b"IHDR", &ihdr);
        // An empty stored zlib stream: a few bytes for 400 megapixels.
        chunk(
            &mut png,
            b"IDAT",
            &[
                0x78, 0x01, 0x01, 0x00, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x01,
            ],
        );
        chunk(&mut png, b"IEND", &[]);
        png
    }

    fn params(value: Value) -> ThumbnailParams {
        ThumbnailParams::parse(value.as_object().unwrap()).unwrap()
    }

    fn dominant(pixel: Rgba<u8>) -> usize {
        let [r, g, b, _] = pixel.0;
        if r > 200 && g > 200 && b > 200 {
            3
        } else {
            [r, g, b]
                .iter()
                .enumerate()
                .max_by_key(|(_, c)| **c)
                .unwrap()
                .0
        }
    }

    #[test]
    fn every_input_format_decodes() {
        let image = corners(40, 30, 255);
        let mut gif = Vec::new();
        {
            let mut encoder = image::codecs::gif::GifEncoder::new(&mut gif);
            encoder
                .encode_frame(image::Frame::new(image.clone()))
                .unwrap();
            encoder
                .encode_frame(image::Frame::new(corners(40, 30, 255)))
                .unwrap();
        }
        let mut webp = Vec::new();
        image::codecs::webp::WebPEncoder::new_lossless(&mut webp)
            .write_image(image.as_raw(), 40, 30, image::ExtendedColorType::Rgba8)
            .unwrap();
        let inputs = [
            ("jpeg", encoded(&image, image::ImageFormat::Jpeg)),
            ("png", encoded(&image, image::ImageFormat::Png)),
            ("tiff", encoded(&image, image::ImageFormat::Tiff)),
            ("webp", webp),
            ("gif, first frame", gif),
        ];
        for (name, bytes) in inputs {
            let decoded = decode(&bytes, 1_000_000).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!((decoded.width(), decoded.height()), (40, 30), "{name}");
            assert_eq!(
                dominant(decoded.to_rgba8().get_pixel(2, 2).to_owned()),
                0,
                "{name}: red top-left"
            );
        }
    }

    #[test]
    fn exif_orientation_is_honoured() {
        let image = corners(40, 20, 255);
        // 6: the camera was turned; the image is shown rotated 90° clockwise.
        let upright = decode(&jpeg_with_orientation(&image, 6), 1_000_000).unwrap();
        assert_eq!((upright.width(), upright.height()), (20, 40));
        let rgba = upright.to_rgba8();
        assert_eq!(
            dominant(*rgba.get_pixel(2, 2)),
            2,
            "blue (was bottom-left) is top-left"
        );
        assert_eq!(
            dominant(*rgba.get_pixel(17, 2)),
            0,
            "red (was top-left) is top-right"
        );
        // 1: as stored.
        let as_is = decode(&jpeg_with_orientation(&image, 1), 1_000_000).unwrap();
        assert_eq!((as_is.width(), as_is.height()), (40, 20));
    }

    #[test]
    fn a_jpeg_shrinks_on_load_upright_and_close_to_a_full_decode() {
        let jpeg = jpeg_with_orientation(&corners(400, 300, 255), 6);
        let params = params(json!({"widths": [40]}));
        let (small, plans) = decode_for(&jpeg, 1_000_000, &params).unwrap();
        // 1/4 scale: 100x75 stored, 75x100 upright; not the full 300x400.
        assert_eq!((small.width(), small.height()), (75, 100));
        assert_eq!((plans[0].width, plans[0].height), (40, 53));
        let shrunk = render(&small, &plans[0], Format::Png).unwrap().to_rgb8();

        let full = decode(&jpeg, 1_000_000).unwrap();
        let full_plan = plan(full.width(), full.height(), &params)[0];
        let reference = render(&full, &full_plan, Format::Png).unwrap().to_rgb8();
        assert_eq!(shrunk.dimensions(), reference.dimensions());
        let diff: u64 = shrunk
            .as_raw()
            .iter()
            .zip(reference.as_raw())
            .map(|(a, b)| a.abs_diff(*b) as u64)
            .sum();
        let mean = diff as f64 / shrunk.as_raw().len() as f64;
        assert!(mean < 6.0, "mean difference {mean}");
        let [r, g, b] = shrunk.get_pixel(2, 2).0;
        assert_eq!(dominant(Rgba([r, g, b, 255])), 2, "blue top-left: upright");

        // Targets near the source size decode in full.
        let (whole, _) = decode_for(
            &jpeg,
            1_000_000,
            &ThumbnailParams::parse(json!({"widths": [200]}).as_object().unwrap()).unwrap(),
        )
        .unwrap();
        assert_eq!((whole.width(), whole.height()), (300, 400));
        // The bomb check comes first on this path too.
        assert!(decode_for(&png_bomb(20_000, 20_000), 100_000_000, &params).is_err());
    }

    #[test]
    fn a_bomb_is_refused_before_decoding_and_junk_is_undecodable() {
        let err = decode(&png_bomb(20_000, 20_000), 100_000_000)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("400000000 pixels") && err.contains("MEDIAONCE_MAX_PIXELS"),
            "{err}"
        );
        let err = decode(b"certainly not an image", 100)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("undecodable image"), "{err}");
        let truncated = &encoded(&corners(40, 30, 255), image::ImageFormat::Png)[..60];
        assert!(decode(truncated, 1_000_000)
            .unwrap_err()
            .to_string()
            .starts_with("undecodable image"));
    }

    #[test]
    fn plans_keep_the_aspect_ratio_and_never_upscale_unless_asked() {
        let widths = params(json!({"widths": [320, 1280, 4000]}));
        let sizes: Vec<(u32, u32, u32)> = plan(2000, 1000, &widths)
            .iter()
            .map(|p| (p.name_width, p.width, p.height))
            .collect();
        assert_eq!(
            sizes,
            [(320, 320, 160), (1280, 1280, 640), (4000, 2000, 1000)]
        );
        let up = params(json!({"widths": [4000], "upscale": true}));
        assert_eq!(
            (
                plan(2000, 1000, &up)[0].width,
                plan(2000, 1000, &up)[0].height
            ),
            (4000, 2000)
        );
        assert_eq!(plan(1, 1, &widths)[0].width, 1, "1x1 stays 1x1");

        let contain = params(json!({"width": 300, "height": 300, "fit": "contain"}));
        let p = plan(2000, 1000, &contain)[0];
        assert_eq!((p.width, p.height), (300, 150));
        let cover = params(json!({"width": 300, "height": 300, "fit": "cover"}));
        let p = plan(2000, 1000, &cover)[0];
        assert_eq!((p.width, p.height), (300, 300));
        assert_eq!(p.crop, (500.0, 0.0, 1000.0, 1000.0), "centre square");
    }

    #[test]
    fn outputs_are_deterministic_and_keep_alpha_where_the_format_has_it() {
        let image = DynamicImage::ImageRgba8(corners(64, 48, 128));
        let p = plan(64, 48, &params(json!({"widths": [32]})))[0];
        for format in [Format::Jpeg, Format::Png, Format::Webp] {
            let encoding = Encoding {
                format,
                quality: 80,
                progressive: false,
            };
            let once = encode(&render(&image, &p, format).unwrap(), encoding).unwrap();
            let twice = encode(&render(&image, &p, format).unwrap(), encoding).unwrap();
            assert_eq!(once, twice, "{format:?} is deterministic");
            let back = image::load_from_memory(&once).unwrap();
            assert_eq!((back.width(), back.height()), (32, 24), "{format:?}");
            assert_eq!(back.color().has_alpha(), format.has_alpha(), "{format:?}");
        }
        // JPEG has no alpha: half-transparent red over white is pink.
        let jpeg = image::load_from_memory(
            &encode(
                &render(&image, &p, Format::Jpeg).unwrap(),
                Encoding {
                    format: Format::Jpeg,
                    quality: 95,
                    progressive: false,
                },
            )
            .unwrap(),
        )
        .unwrap()
        .to_rgb8();
        let [r, g, b] = jpeg.get_pixel(2, 2).0;
        assert!(
            r > 240 && (100..160).contains(&g) && (100..160).contains(&b),
            "{r} {g} {b}"
        );
    }

    /// The markers of a JPEG up to its first scan: (marker, segment body).
    fn jpeg_segments(jpeg: &[u8]) -> Vec<(u8, Vec<u8>)> {
        assert_eq!(&jpeg[..2], &[0xFF, 0xD8], "starts with SOI");
        let (mut at, mut segments) = (2, Vec::new());
        loop {
            assert_eq!(jpeg[at], 0xFF, "a marker at {at}");
            let marker = jpeg[at + 1];
            let length = u16::from_be_bytes([jpeg[at + 2], jpeg[at + 3]]) as usize;
            segments.push((marker, jpeg[at + 4..at + 2 + length].to_vec()));
            if marker == 0xDA {
                return segments;
            }
            at += 2 + length;
        }
    }

    #[test]
    fn jpegs_are_subsampled_below_90_interleaved_and_carry_no_metadata() {
        // An upload with EXIF (orientation 6: turned a quarter).
        let input = jpeg_with_orientation(&corners(64, 48, 255), 6);
        let image = decode(&input, DEFAULT_MAX_PIXELS).unwrap();
        let p = plan(
            image.width(),
            image.height(),
            &params(json!({"widths": [40]})),
        )[0];
        let out = |quality: u8, progressive: bool| {
            let encoding = Encoding {
                format: Format::Jpeg,
                quality,
                progressive,
            };
            encode(&render(&image, &p, Format::Jpeg).unwrap(), encoding).unwrap()
        };
        for (quality, luma_sampling) in [(82, 0x22), (89, 0x22), (90, 0x11), (100, 0x11)] {
            let segments = jpeg_segments(&out(quality, false));
            let markers: Vec<u8> = segments.iter().map(|(m, _)| *m).collect();
            // JFIF, the tables, one baseline frame, one scan: no APP1 (EXIF,
            // XMP), APP2 (ICC) or COM.
            assert!(
                markers
                    .iter()
                    .all(|m| matches!(m, 0xE0 | 0xDB | 0xC4 | 0xC0 | 0xDA)),
                "q{quality}: {markers:x?}"
            );
            let (_, frame) = segments.iter().find(|(m, _)| *m == 0xC0).unwrap();
            let sampling: Vec<u8> = (0..3).map(|c| frame[7 + 3 * c]).collect();
            assert_eq!(sampling, [luma_sampling, 0x11, 0x11], "q{quality}");
            // Interleaved: the one scan holds all three components (some
            // decoders misread 4:2:0 written one component per scan).
            let (_, scan) = segments.last().unwrap();
            assert_eq!(scan[0], 3, "q{quality}: components in the first scan");
        }
        let progressive = jpeg_segments(&out(82, true));
        assert!(progressive.iter().any(|(m, _)| *m == 0xC2), "SOF2");
        let back = image::load_from_memory(&out(82, true)).unwrap();
        assert_eq!((back.width(), back.height()), (40, 53), "upright");
    }

    #[test]
    fn params_are_checked_by_name() {
        let err = |v: Value| ThumbnailParams::parse(v.as_object().unwrap()).unwrap_err();
        assert!(err(json!({})).contains("give widths"));
        assert!(err(json!({"widths": []})).contains("non-empty"));
        assert!(err(json!({"widths": [0]})).contains("1 to 65535"));
        assert!(err(json!({"widths": [320, 320]})).contains("not repeat"));
        assert!(err(json!({"widths": [320], "width": 10, "height": 10})).contains("not both"));
        assert!(err(json!({"width": 10})).contains("give widths"));
        assert!(err(json!({"width": 10, "height": 10, "fit": "stretch"})).contains("fit must be"));
        assert!(err(json!({"widths": [320], "fit": "cover"})).contains("fit goes with"));
        assert!(err(json!({"widths": [320], "format": "gif"})).contains("format must be"));
        assert!(err(json!({"widths": [320], "quality": 101})).contains("quality must be"));
        assert!(err(json!({"widths": [320], "format": "png", "quality": 80})).contains("not png"));
        assert!(err(json!({"widths": [320], "upscale": "yes"})).contains("upscale must be"));
        assert!(err(json!({"widths": [320], "sharpen": 1})).contains("unknown param"));
        let ok = params(json!({"widths": [320], "format": "webp", "quality": 70, "upscale": true}));
        assert_eq!(
            (ok.format, ok.quality, ok.upscale),
            (Format::Webp, 70, true)
        );
    }
}
