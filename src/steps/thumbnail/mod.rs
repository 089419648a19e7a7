//! `thumbnail`: resized copies of an image, deterministic to the byte.
//!
//! Decodes JPEG with `jpeg-decoder` (a JPEG much larger than its outputs
//! at 1/2, 1/4 or 1/8 scale through its DCT, by `mediaonce_jpeg::scaled` when the
//! file is of the common shape), PNG, WebP, GIF (the first frame) and TIFF
//! with the `image` crate, and HEIC and AVIF through ffmpeg (`heif`);
//! honours EXIF orientation, checks the declared dimensions against
//! `MEDIAONCE_MAX_PIXELS` before decoding a pixel (a decompression bomb
//! fails the job, and counts towards the attempts cap), converts pixels
//! tagged with an ICC profile to sRGB (`colour`), resizes with
//! `fast_image_resize` (SIMD convolution, Lanczos3, alpha premultiplied),
//! and encodes JPEG, PNG, lossy WebP or AVIF (`encode`, `avif`).
//!
//! Params:
//! - `widths`: target widths, e.g. `[320, 1280]`, aspect ratio kept; or
//!   `width` and `height` with `fit`: `contain` (inside the box) or `cover`
//!   (fills the box, centre-cropped);
//! - `format`: `jpeg` (default), `png`, `webp` or `avif`; `quality`: 1 to
//!   100 for jpeg, webp and avif (default 82); `progressive`: jpeg only
//!   (default false);
//! - `upscale`: false by default: an image smaller than the target keeps its
//!   size.
//!
//! Outputs are named by the requested width:
//! `thumb-<width>.<jpg|png|webp|avif>`, so a reader knows the paths from
//! the recipe alone.

use fast_image_resize::images::{TypedImage, TypedImageRef};
use fast_image_resize::pixels::{U8x3, U8x4};
use fast_image_resize::{FilterType, PixelTrait, ResizeAlg, ResizeOptions, Resizer};
use std::borrow::Cow;
use std::path::PathBuf;
use std::time::Duration;

use image::DynamicImage;
use serde_json::{Map, Value};

use crate::step::{InputUse, JobOutputs, Step, StepContext, StepError};

mod avif;
mod colour;
mod decode;
mod encode;
mod heif;
mod resize16;

pub use decode::{decode, decode_for};
pub use encode::{encode, Encoding};
pub use heif::decode as decode_heif;

/// Images declaring more pixels than this are refused before decoding.
pub const ENV_MAX_PIXELS: &str = "MEDIAONCE_MAX_PIXELS";
/// 100 megapixels.
pub const DEFAULT_MAX_PIXELS: u64 = 100_000_000;

/// Inputs larger than this are refused before reading (bytes).
pub const MAX_INPUT_BYTES: u64 = 512 * 1024 * 1024;

/// The step, with the pixel limit images are checked against before
/// decoding (`MEDIAONCE_MAX_PIXELS`) and the ffmpeg that decodes HEIC and
/// AVIF tiles (`MEDIAONCE_FFMPEG`, as for hls-package).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Thumbnail {
    pub max_pixels: u64,
    pub ffmpeg: PathBuf,
}

impl Thumbnail {
    /// The step with `MEDIAONCE_MAX_PIXELS` and `MEDIAONCE_FFMPEG` read
    /// through `lookup`. A pixel limit that is not a positive integer takes
    /// the default here; the configuration, read through the same lookup,
    /// refuses it at start-up.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let max_pixels =
            max_pixels(lookup(ENV_MAX_PIXELS).as_deref()).unwrap_or(DEFAULT_MAX_PIXELS);
        let ffmpeg = crate::steps::ffmpeg::ffmpeg_from(&lookup);
        Thumbnail { max_pixels, ffmpeg }
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
    /// Encoded by ffmpeg (libaom): 8-bit 4:2:0, tagged sRGB, with an
    /// alpha image when the picture has transparency.
    Avif,
}

impl Format {
    fn extension(self) -> &'static str {
        match self {
            Format::Jpeg => "jpg",
            Format::Png => "png",
            Format::Webp => "webp",
            Format::Avif => "avif",
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            Format::Jpeg => "image/jpeg",
            Format::Png => "image/png",
            Format::Webp => "image/webp",
            Format::Avif => "image/avif",
        }
    }

    fn has_alpha(self) -> bool {
        matches!(self, Format::Png | Format::Webp | Format::Avif)
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
    /// How the outputs are encoded.
    pub fn encoding(&self) -> Encoding {
        Encoding {
            format: self.format,
            quality: self.quality,
            progressive: self.progressive,
        }
    }

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
            Some(Some("avif")) => Format::Avif,
            Some(_) => {
                return Err(format!(
                    "format must be \"jpeg\", \"png\", \"webp\" or \"avif\", got {}",
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
            return Err("quality applies to jpeg, webp and avif, not png".into());
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

/// Resizes to one plan, keeping alpha when the format has it (JPEG gets the
/// image over white). A 16-bit (or float) image is resized at 16 bits and
/// only reduced to 8 by the encoder, if its format has 8 (PNG keeps 16): a
/// smooth gradient is not quantised twice.
pub fn render(
    image: &DynamicImage,
    plan: &Plan,
    format: Format,
) -> Result<DynamicImage, StepError> {
    let deep = matches!(
        image,
        DynamicImage::ImageRgb16(_)
            | DynamicImage::ImageRgba16(_)
            | DynamicImage::ImageLuma16(_)
            | DynamicImage::ImageLumaA16(_)
            | DynamicImage::ImageRgb32F(_)
            | DynamicImage::ImageRgba32F(_)
    );
    let alpha = image.color().has_alpha();
    let (left, top, width, height) = plan.crop;
    let options = ResizeOptions::new()
        .resize_alg(ResizeAlg::Convolution(FilterType::Lanczos3))
        .crop(left, top, width, height);
    // 8-bit RGB and RGBA through fast_image_resize, typed so that its code
    // for every other pixel type stays out of the binary; 16-bit through
    // `resize16` (see there why).
    let failed = |e: String| StepError::Failed(format!("resizing failed: {e}"));
    let (w, h) = (image.width(), image.height());
    let size = (plan.width, plan.height);
    Ok(match (format.has_alpha() && alpha, deep) {
        (true, false) => {
            let mut target = image::RgbaImage::new(plan.width, plan.height);
            let source = match image {
                DynamicImage::ImageRgba8(rgba) => Cow::Borrowed(rgba),
                other => Cow::Owned(other.to_rgba8()),
            };
            resize_typed::<U8x4>(&source, w, h, &mut target, plan, &options).map_err(failed)?;
            DynamicImage::ImageRgba8(target)
        }
        (true, true) => {
            let source = image.to_rgba16();
            let pixels = resize16::resize(source.as_raw(), (w, h), 4, plan.crop, size);
            let target = image::ImageBuffer::from_raw(plan.width, plan.height, pixels)
                .ok_or_else(|| failed("the 16-bit resize returned a wrong size".into()))?;
            DynamicImage::ImageRgba16(target)
        }
        (false, true) if !alpha => {
            let source = image.to_rgb16();
            let pixels = resize16::resize(source.as_raw(), (w, h), 3, plan.crop, size);
            let target = image::ImageBuffer::from_raw(plan.width, plan.height, pixels)
                .ok_or_else(|| failed("the 16-bit resize returned a wrong size".into()))?;
            DynamicImage::ImageRgb16(target)
        }
        (false, _) => {
            // The decoded image itself when it is 8-bit RGB, as a JPEG is:
            // not a copy of its megabytes.
            let source = match image {
                DynamicImage::ImageRgb8(rgb) => Cow::Borrowed(rgb),
                other if alpha => Cow::Owned(over_white(other)),
                other => Cow::Owned(other.to_rgb8()),
            };
            let mut target = image::RgbImage::new(plan.width, plan.height);
            resize_typed::<U8x3>(&source, w, h, &mut target, plan, &options).map_err(failed)?;
            DynamicImage::ImageRgb8(target)
        }
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

    fn time_needed(&self, params: &ThumbnailParams) -> Duration {
        match params.format {
            Format::Avif => AVIF_TIME_NEEDED,
            _ => Duration::ZERO,
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
        // HEIC and AVIF: tiles decoded by ffmpeg, in its own process.
        let heif_image = match heif::is_heif(&bytes) {
            Some(_) => {
                Some(heif::decode(&bytes, max_pixels, &self.ffmpeg, time_left(context)).await?)
            }
            None => None,
        };
        let encoding = params.encoding();
        // Decoding and resizing are CPU work: off the async runtime's threads.
        let rendered =
            tokio::task::spawn_blocking(move || -> Result<Vec<(u32, Rendered)>, StepError> {
                let (image, plans) = match heif_image {
                    Some(image) => {
                        let plans = plan(image.width(), image.height(), &params);
                        (image, plans)
                    }
                    // Shrunk on load when every output allows it (a JPEG at
                    // 1/2, 1/4 or 1/8 scale), with the plans in its pixels.
                    None => decode_for(&bytes, max_pixels, &params)?,
                };
                plans
                    .iter()
                    .map(|p| {
                        let image = render(&image, p, format)?;
                        Ok((
                            p.name_width,
                            match format {
                                Format::Avif => Rendered::ForFfmpeg(image),
                                _ => Rendered::Encoded(encode(&image, encoding)?),
                            },
                        ))
                    })
                    .collect()
            })
            .await
            .map_err(|e| StepError::Failed(format!("thumbnail task failed: {e}")))??;
        for (name_width, rendered) in rendered {
            let bytes = match rendered {
                Rendered::Encoded(bytes) => bytes,
                Rendered::ForFfmpeg(image) => {
                    avif::encode(&image, encoding.quality, &self.ffmpeg, time_left(context)).await?
                }
            };
            let name = format!("thumb-{name_width}.{}", format.extension());
            outputs
                .put_bytes(&name, format.content_type(), bytes)
                .await?;
        }
        Ok(())
    }
}

/// A rendered output: encoded already, or pixels for ffmpeg to encode.
enum Rendered {
    Encoded(Vec<u8>),
    ForFfmpeg(DynamicImage),
}

/// How long ffmpeg may run, by the worker's clock.
fn time_left(context: &StepContext<'_>) -> Option<Duration> {
    context
        .deadline_ms
        .map(|deadline| Duration::from_millis(deadline.saturating_sub(context.clock.now_ms())))
}

/// The time an AVIF recipe declares: libaom's still-picture encode is
/// seconds per output (~1.6 s at 1280 px on two cores), and ffmpeg is
/// stopped `ffmpeg::STOP_BEFORE_DEADLINE` before the deadline.
pub const AVIF_TIME_NEEDED: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests;
