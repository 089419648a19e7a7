//! HEIC and AVIF inputs (the formats phones write). The container is read
//! here (`bmff::heif`: the primary image, its tiles, orientation and
//! colour); the tiles are decoded by the pinned ffmpeg that hls-package
//! runs (its HEVC decoder and dav1d), in its own process with a cleared
//! environment and nothing but a pipe to read; the grid is put together,
//! turned and converted to sRGB here.
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

use image::{DynamicImage, ImageBuffer, Rgb};

use super::colour;
use crate::bmff::heif::{parse_heif, Codec, HeifImage, Nclx, Transform};
use crate::step::StepError;

/// Whether `bytes` is a HEIF still image this step decodes (HEIC or AVIF
/// by its `ftyp` brands).
pub fn is_heif(bytes: &[u8]) -> Option<Codec> {
    crate::bmff::heif::heif_codec(bytes)
}

/// Decodes the primary image of a HEIC or AVIF file to sRGB, upright.
/// `time_left`: how long ffmpeg may run before it is stopped.
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
    let decoded = (heif.columns as u64 * heif.tile_width as u64)
        * (heif.rows as u64 * heif.tile_height as u64);
    if decoded > max_pixels {
        return Err(StepError::Unprocessable(format!(
            "image declares {}x{} in {} tiles = {decoded} pixels decoded, over \
             MEDIAONCE_MAX_PIXELS = {max_pixels}: refused before decoding",
            heif.width,
            heif.height,
            heif.tiles.len()
        )));
    }
    let stream = coded_stream(&heif)?;
    let deep = heif.bit_depth > 8;
    let frame_bytes =
        heif.tile_width as usize * heif.tile_height as usize * if deep { 6 } else { 3 };
    let expected = frame_bytes * heif.tiles.len();
    let pixels = super::ffmpeg::run(
        ffmpeg,
        &ffmpeg_args(&heif, deep),
        &std::env::temp_dir(),
        stream,
        expected,
        time_left,
    )
    .await
    .map_err(|e| match e {
        super::ffmpeg::Failure::Output(why) => {
            StepError::Unprocessable(format!("undecodable image: {why}"))
        }
        super::ffmpeg::Failure::Step(e) => e,
    })?;
    // Laying out, turning and converting 12 MP is CPU work: off the async
    // runtime's threads.
    tokio::task::spawn_blocking(move || picture(&heif, &pixels, deep))
        .await
        .map_err(|e| StepError::Failed(format!("HEIF picture task failed: {e}")))
}

/// The decoded tiles as one upright sRGB picture.
fn picture(heif: &HeifImage, pixels: &[u8], deep: bool) -> DynamicImage {
    let image = if deep {
        let samples: Vec<u16> = pixels
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        ImageBuffer::<Rgb<u16>, _>::from_raw(heif.width, heif.height, assemble(heif, &samples))
            .map(DynamicImage::ImageRgb16)
    } else {
        ImageBuffer::<Rgb<u8>, _>::from_raw(heif.width, heif.height, assemble(heif, pixels))
            .map(DynamicImage::ImageRgb8)
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

/// The tiles as one stream ffmpeg's raw demuxer reads, one picture each:
/// HEVC in Annex B (start codes; the parameter sets from `hvcC` first),
/// AV1 as low-overhead OBUs (a temporal delimiter before each tile, the
/// sequence header from `av1C` before the first).
fn coded_stream(heif: &HeifImage) -> Result<Vec<u8>, StepError> {
    let bad = |what: String| StepError::Unprocessable(format!("undecodable image: {what}"));
    let mut stream = Vec::new();
    match heif.codec {
        Codec::Hevc => {
            let config = &heif.config;
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
            for tile in &heif.tiles {
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
            if heif.config.len() < 4 {
                return Err(bad("an 'av1C' too short to hold its header".into()));
            }
            let sequence_header = &heif.config[4..];
            for (i, tile) in heif.tiles.iter().enumerate() {
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
/// of the codec the container named, and writes raw RGB frames.
fn ffmpeg_args(heif: &HeifImage, deep: bool) -> Vec<String> {
    let mut args: Vec<String> = [
        "-hide_banner",
        "-loglevel",
        "error",
        "-nostats",
        "-protocol_whitelist",
        "pipe",
        "-f",
        match heif.codec {
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
    }) = heif.nclx
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
    args.extend(
        [
            "-f",
            "rawvideo",
            "-pix_fmt",
            if deep { "rgb48le" } else { "rgb24" },
            "pipe:1",
        ]
        .map(String::from),
    );
    args
}

/// The tiles (row-major frames of `tile_width` × `tile_height`) laid out
/// in their grid and cut to the image's size.
fn assemble<T: Copy + Default>(heif: &HeifImage, frames: &[T]) -> Vec<T> {
    let (tw, th) = (heif.tile_width as usize, heif.tile_height as usize);
    let (w, h) = (heif.width as usize, heif.height as usize);
    let mut out = vec![T::default(); w * h * 3];
    for (index, frame) in frames.chunks_exact(tw * th * 3).enumerate() {
        let (column, row) = (index % heif.columns as usize, index / heif.columns as usize);
        let (x0, y0) = (column * tw, row * th);
        if x0 >= w || y0 >= h {
            continue;
        }
        let width = tw.min(w - x0);
        for y in 0..th.min(h - y0) {
            let from = &frame[y * tw * 3..(y * tw + width) * 3];
            let at = ((y0 + y) * w + x0) * 3;
            out[at..at + width * 3].copy_from_slice(from);
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
