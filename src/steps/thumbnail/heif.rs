//! HEIC and AVIF inputs (the formats phones write). The container is read
//! here (`bmff::heif`: the primary image, its tiles, orientation and
//! colour, its alpha image); the tiles are decoded by the pinned ffmpeg
//! that hls-package runs (its HEVC decoder and dav1d), in its own process
//! with a cleared environment and nothing but a pipe to read; the grid is
//! put together, joined to its alpha, turned and converted to sRGB here.
//!
//! Why ffmpeg: no pure-Rust HEVC decoder exists, and the C ones (libde265
//! under libheif, dav1d) would parse every upload inside the function's
//! own process, next to its credentials, and grow the arm64 `bootstrap`
//! by megabytes. ffmpeg ships already (the `FfmpegLayer`), for arm64 too,
//! and runs with only what a decode needs. Why not let ffmpeg read the
//! HEIF file itself: 7.0 does not assemble grids, and an iPhone photo is a
//! grid of 512 × 512 tiles.

use std::path::Path;
use std::time::Duration;

use image::{DynamicImage, ImageBuffer, Rgb, Rgba};

use super::colour;
use crate::bmff::heif::{parse_heif, Codec, Coded, HeifImage, Nclx, Transform};
use crate::step::StepError;

/// Whether `bytes` is a HEIF still image this step decodes (HEIC or AVIF
/// by its `ftyp` brands).
pub fn is_heif(bytes: &[u8]) -> Option<Codec> {
    crate::bmff::heif::heif_codec(bytes)
}

/// Decodes the primary image of a HEIC or AVIF file to sRGB, upright,
/// with its alpha when it has an alpha image. `time_left`: how long
/// ffmpeg may run before it is stopped.
pub async fn decode(
    bytes: &[u8],
    max_pixels: u64,
    ffmpeg: &Path,
    time_left: Option<Duration>,
) -> Result<DynamicImage, StepError> {
    let codec = is_heif(bytes).unwrap_or(Codec::Hevc);
    let heif = parse_heif(bytes).map_err(|e| {
        StepError::Unprocessable(format!("undecodable image: {} file: {e}", codec.name()))
    })?;
    // Every decoded pixel counts, the tiles' overhang included.
    for coded in std::iter::once(&heif.picture).chain(&heif.alpha) {
        let decoded = coded.decoded_pixels();
        if decoded > max_pixels {
            return Err(StepError::Unprocessable(format!(
                "image declares {}x{} in {} tiles = {decoded} pixels decoded, over \
                 MEDIAONCE_MAX_PIXELS = {max_pixels}: refused before decoding",
                coded.width,
                coded.height,
                coded.tiles.len()
            )));
        }
    }
    let deep = heif.picture.bit_depth > 8;
    let colour = tiles(
        ffmpeg,
        &heif.picture,
        heif.nclx,
        Planes::Rgb,
        deep,
        time_left,
    );
    let pixels = match &heif.alpha {
        None => (colour.await?, None),
        Some(alpha) => {
            let alpha = tiles(ffmpeg, alpha, None, Planes::Grey, deep, time_left);
            let (colour, alpha) = tokio::try_join!(colour, alpha)?;
            (colour, Some(alpha))
        }
    };
    // Laying out, turning and converting 12 MP is CPU work: off the async
    // runtime's threads.
    tokio::task::spawn_blocking(move || picture(&heif, pixels, deep))
        .await
        .map_err(|e| StepError::Failed(format!("HEIF picture task failed: {e}")))
}

/// What ffmpeg writes for a coded image: RGB for the colour image, one
/// grey channel for alpha.
#[derive(Clone, Copy)]
enum Planes {
    Rgb,
    Grey,
}

impl Planes {
    fn channels(self) -> usize {
        match self {
            Planes::Rgb => 3,
            Planes::Grey => 1,
        }
    }
}

/// `coded`'s tiles decoded by ffmpeg: row-major frames of samples (two
/// bytes each, little-endian, when `deep`).
async fn tiles(
    ffmpeg: &Path,
    coded: &Coded,
    nclx: Option<Nclx>,
    planes: Planes,
    deep: bool,
    time_left: Option<Duration>,
) -> Result<Vec<u8>, StepError> {
    let stream = coded_stream(coded)?;
    let frame_bytes = coded.tile_width as usize
        * coded.tile_height as usize
        * planes.channels()
        * if deep { 2 } else { 1 };
    crate::steps::ffmpeg::piped::run(
        ffmpeg,
        &ffmpeg_args(coded.codec, nclx, planes, deep),
        &std::env::temp_dir(),
        stream,
        frame_bytes * coded.tiles.len(),
        time_left,
    )
    .await
    .map_err(|e| match e {
        crate::steps::ffmpeg::piped::Failure::Output(why) => {
            StepError::Unprocessable(format!("undecodable image: {why}"))
        }
        crate::steps::ffmpeg::piped::Failure::Step(e) => e,
    })
}

/// The decoded tiles (colour, and alpha if any) as one upright sRGB
/// picture.
fn picture(
    heif: &HeifImage,
    (colour, alpha): (Vec<u8>, Option<Vec<u8>>),
    deep: bool,
) -> DynamicImage {
    let (w, h) = (heif.picture.width, heif.picture.height);
    let image = if deep {
        let samples = |bytes: &[u8]| -> Vec<u16> {
            bytes
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .collect()
        };
        let rgb = assemble(&heif.picture, &samples(&colour), 3);
        match &alpha {
            Some(alpha) => {
                let a = assemble(
                    heif.alpha.as_ref().expect("alpha decoded"),
                    &samples(alpha),
                    1,
                );
                let rgba = with_alpha(&rgb, &a, heif.premultiplied, u16::MAX);
                ImageBuffer::<Rgba<u16>, _>::from_raw(w, h, rgba).map(DynamicImage::ImageRgba16)
            }
            None => ImageBuffer::<Rgb<u16>, _>::from_raw(w, h, rgb).map(DynamicImage::ImageRgb16),
        }
    } else {
        let rgb = assemble(&heif.picture, &colour, 3);
        match &alpha {
            Some(alpha) => {
                let a = assemble(heif.alpha.as_ref().expect("alpha decoded"), alpha, 1);
                let rgba = with_alpha(&rgb, &a, heif.premultiplied, u8::MAX);
                ImageBuffer::<Rgba<u8>, _>::from_raw(w, h, rgba).map(DynamicImage::ImageRgba8)
            }
            None => ImageBuffer::<Rgb<u8>, _>::from_raw(w, h, rgb).map(DynamicImage::ImageRgb8),
        }
    }
    .expect("assemble sizes its buffer for the image");
    let image = oriented(image, &heif.transforms);
    let (image, conversion) = match (&heif.icc, heif.nclx) {
        (Some(icc), _) => colour::to_srgb(image, Some(icc)),
        (None, Some(nclx)) => colour::cicp_to_srgb(image, nclx.primaries, nclx.transfer),
        (None, None) => (image, colour::Conversion::Untagged),
    };
    if let colour::Conversion::Ignored(why) = conversion {
        tracing::warn!(problem = %why, "the image's colour profile was ignored; taken as sRGB");
    }
    image
}

/// RGB and alpha interleaved as RGBA; premultiplied colour divided back
/// by its alpha (`prem`), as every later stage expects it straight.
fn with_alpha<T>(rgb: &[T], alpha: &[T], premultiplied: bool, max: T) -> Vec<T>
where
    T: Copy + Into<u32> + TryFrom<u32>,
{
    let max32: u32 = max.into();
    let mut out = Vec::with_capacity(alpha.len() * 4);
    for (px, &a) in rgb.chunks_exact(3).zip(alpha) {
        for &c in px {
            let c = if premultiplied {
                let a: u32 = a.into();
                match a {
                    0 => 0,
                    a => ((c.into() * max32 + a / 2) / a).min(max32),
                }
            } else {
                c.into()
            };
            out.push(T::try_from(c).unwrap_or(max));
        }
        out.push(a);
    }
    out
}

/// The tiles as one stream ffmpeg's raw demuxer reads, one picture each:
/// HEVC in Annex B (start codes; the parameter sets from `hvcC` first),
/// AV1 as low-overhead OBUs (a temporal delimiter before each tile, the
/// sequence header from `av1C` before the first).
fn coded_stream(coded: &Coded) -> Result<Vec<u8>, StepError> {
    let bad = |what: String| StepError::Unprocessable(format!("undecodable image: {what}"));
    let mut stream = Vec::new();
    match coded.codec {
        Codec::Hevc => {
            let config = &coded.config;
            if config.len() < 23 {
                return Err(bad("an 'hvcC' too short to hold its header".into()));
            }
            let length_size = (config[21] & 3) as usize + 1;
            let arrays = config[22];
            let mut at = 23usize;
            for _ in 0..arrays {
                let count = config
                    .get(at + 1..at + 3)
                    .map(|b| u16::from_be_bytes([b[0], b[1]]))
                    .ok_or_else(|| bad("'hvcC' ends inside its arrays".into()))?;
                at += 3;
                for _ in 0..count {
                    let len = config
                        .get(at..at + 2)
                        .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
                        .ok_or_else(|| bad("'hvcC' ends inside a NAL unit".into()))?;
                    let nal = config
                        .get(at + 2..at + 2 + len)
                        .ok_or_else(|| bad("'hvcC' ends inside a NAL unit".into()))?;
                    stream.extend_from_slice(&[0, 0, 0, 1]);
                    stream.extend_from_slice(nal);
                    at += 2 + len;
                }
            }
            for tile in &coded.tiles {
                let mut at = 0usize;
                while at < tile.len() {
                    let len = tile
                        .get(at..at + length_size)
                        .map(|b| b.iter().fold(0usize, |n, &x| n << 8 | x as usize))
                        .ok_or_else(|| bad("a tile ends inside a NAL unit's length".into()))?;
                    let nal = tile
                        .get(at + length_size..at + length_size + len)
                        .ok_or_else(|| bad("a tile's NAL unit runs past its end".into()))?;
                    stream.extend_from_slice(&[0, 0, 0, 1]);
                    stream.extend_from_slice(nal);
                    at += length_size + len;
                }
            }
        }
        Codec::Av1 => {
            if coded.config.len() < 4 {
                return Err(bad("an 'av1C' too short to hold its header".into()));
            }
            let sequence_header = &coded.config[4..];
            for (i, tile) in coded.tiles.iter().enumerate() {
                // OBU_TEMPORAL_DELIMITER with obu_has_size_field, size 0.
                stream.extend_from_slice(&[0x12, 0x00]);
                if i == 0 {
                    stream.extend_from_slice(sequence_header);
                }
                stream.extend_from_slice(tile);
            }
        }
    }
    Ok(stream)
}

/// ffmpeg reads only the pipe (no files, no network), as the raw stream
/// of the codec the container named, and writes raw RGB frames, or grey
/// ones for an alpha image (its luma, as it is stored).
fn ffmpeg_args(codec: Codec, nclx: Option<Nclx>, planes: Planes, deep: bool) -> Vec<String> {
    let mut args: Vec<String> = [
        "-hide_banner",
        "-loglevel",
        "error",
        "-nostats",
        "-protocol_whitelist",
        "pipe",
        "-f",
        match codec {
            Codec::Hevc => "hevc",
            Codec::Av1 => "obu",
        },
        "-i",
        "pipe:0",
        // One output frame per tile, none dropped or repeated for a rate.
        "-fps_mode",
        "passthrough",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // The container's code points, when it has them, override what the
    // coded stream says (HEIF's rule); else ffmpeg reads the stream's.
    if let Some(Nclx {
        matrix, full_range, ..
    }) = nclx
    {
        let matrix = match matrix {
            1 => Some("bt709"),
            5 | 6 => Some("bt601"),
            9 | 10 => Some("bt2020"),
            7 => Some("smpte240m"),
            _ => None,
        };
        let range = if full_range { "full" } else { "limited" };
        let mut filter = format!("scale=in_range={range}");
        if let Some(matrix) = matrix {
            filter.push_str(&format!(":in_color_matrix={matrix}"));
        }
        args.extend(["-vf".into(), filter]);
    }
    let pix_fmt = match (planes, deep) {
        (Planes::Rgb, false) => "rgb24",
        (Planes::Rgb, true) => "rgb48le",
        (Planes::Grey, false) => "gray",
        (Planes::Grey, true) => "gray16le",
    };
    args.extend(["-f", "rawvideo", "-pix_fmt", pix_fmt, "pipe:1"].map(String::from));
    args
}

/// The tiles (row-major frames of `tile_width` × `tile_height` pixels of
/// `channels` samples) laid out in their grid and cut to the image's size.
fn assemble<T: Copy + Default>(coded: &Coded, frames: &[T], channels: usize) -> Vec<T> {
    let (tw, th) = (coded.tile_width as usize, coded.tile_height as usize);
    let (w, h) = (coded.width as usize, coded.height as usize);
    let mut out = vec![T::default(); w * h * channels];
    for (index, frame) in frames.chunks_exact(tw * th * channels).enumerate() {
        let (column, row) = (
            index % coded.columns as usize,
            index / coded.columns as usize,
        );
        let (x0, y0) = (column * tw, row * th);
        if x0 >= w || y0 >= h {
            continue;
        }
        let width = tw.min(w - x0);
        for y in 0..th.min(h - y0) {
            let from = &frame[y * tw * channels..(y * tw + width) * channels];
            let at = ((y0 + y) * w + x0) * channels;
            out[at..at + width * channels].copy_from_slice(from);
        }
    }
    out
}

/// The image after its `irot`/`imir` transforms, in the file's order.
fn oriented(mut image: DynamicImage, transforms: &[Transform]) -> DynamicImage {
    for transform in transforms {
        image = match transform {
            // Anticlockwise quarter turns.
            Transform::Rotate(1) => image.rotate270(),
            Transform::Rotate(2) => image.rotate180(),
            Transform::Rotate(3) => image.rotate90(),
            Transform::Rotate(_) => image,
            Transform::MirrorLeftRight => image.fliph(),
            Transform::MirrorTopBottom => image.flipv(),
        };
    }
    image
}
