//! `storyboard`: a video's sprite sheets of evenly spaced frames and
//! `storyboard.vtt`, whose cues point into them (`#xywh=`), the way Mux
//! and Gcore publish them for seek-bar previews.
//!
//! Chained to an `hls-package` recipe's `package.json` ([`index`]), not
//! to the upload (README, "Pipelines"; DESIGN.md, "Storyboards", has the
//! measurements). The tiles are cut from the package's smallest rendition
//! at least a tile wide. Its pictures are upright already, and decoding
//! them costs a fraction of the source. A keyframe opens every segment,
//! so a cue that falls on a segment's start costs one small keyframe's
//! decode: the segment's I-frame byte range, nothing after it. Other cues
//! cost the decode of their segment, a few seconds of the small picture.
//! A long video's storyboard reads only the segments its cues fall in,
//! never the source. Since a split package is byte for byte the package
//! of one run, so is its storyboard.
//!
//! The job's key covers every byte it reads. The index names each
//! segment's SHA-256, and each segment is read whole and checked against
//! it ([`crate::step::JobInput::read_beside`]). ffmpeg gets the pieces on
//! a pipe (`-protocol_whitelist pipe`, MPEG-TS forced), picks the cues'
//! frames by their timestamps and scales them. Rust lays them out on the
//! sheets and encodes these, so the bytes are the same on every run.
//!
//! [`index`]: crate::steps::hls::index

pub mod plan;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use serde_json::{Map, Value};

pub use plan::{Board, SheetFormat, StoryboardParams};

use crate::step::{content_type, InputUse, JobOutputs, Step, StepContext, StepError};
use crate::steps::ffmpeg::piped::{run, Failure};
use crate::steps::ffmpeg::{ffmpeg_from, time_left, STOP_BEFORE_DEADLINE};
use crate::steps::hls::index::{IndexedSegment, PackageIndex};
use crate::steps::hls::ts;
use crate::steps::thumbnail::{self, Encoding, Format};

/// The largest index read: a 24-hour package at 1 s segments in four
/// renditions is under 40 MB.
const MAX_INDEX_BYTES: u64 = 64 << 20;

/// Segments read at once.
const READS_AT_ONCE: usize = 8;

/// What a run may take: reading and decoding a few hundred small
/// segments (a 3-hour video's 600 tiles, half of them off a segment's
/// start, decode about 30,000 frames of the smallest rendition: seconds).
const TIME_NEEDED: Duration = Duration::from_secs(30);

/// The step.
#[derive(Debug, Clone)]
pub struct Storyboard {
    pub ffmpeg: PathBuf,
}

impl Storyboard {
    /// ffmpeg from `MEDIAONCE_FFMPEG` (through `lookup`) or `PATH`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        Storyboard {
            ffmpeg: ffmpeg_from(lookup),
        }
    }
}

/// One segment's part of the decode: its bytes to pipe (the keyframe's
/// range alone when every cue in it shows its first frame), and the
/// frames its cues show.
struct Piece {
    bytes: Vec<u8>,
    frames: Vec<u64>,
}

#[async_trait::async_trait]
impl Step for Storyboard {
    fn name(&self) -> &'static str {
        "storyboard"
    }

    type Params = StoryboardParams;

    fn params(&self, params: &Map<String, Value>) -> Result<StoryboardParams, String> {
        StoryboardParams::from_params(params)
    }

    fn input_use(&self, _params: &StoryboardParams) -> InputUse {
        InputUse::Memory {
            max_bytes: MAX_INDEX_BYTES,
        }
    }

    fn time_needed(&self, _params: &StoryboardParams) -> Duration {
        TIME_NEEDED + STOP_BEFORE_DEADLINE
    }

    async fn run(
        &self,
        params: &StoryboardParams,
        context: &StepContext<'_>,
        outputs: &mut JobOutputs,
    ) -> Result<(), StepError> {
        let input = context.input;
        if input.head.size > MAX_INDEX_BYTES {
            return Err(StepError::Unprocessable(format!(
                "storyboard reads an hls-package's package.json; the input is {} bytes",
                input.head.size
            )));
        }
        let index = PackageIndex::parse(&input.bytes().await?).map_err(|e| {
            StepError::Unprocessable(format!(
                "storyboard's input must be an hls-package's package.json: {e}"
            ))
        })?;
        let board = Board::plan(&index, params);
        let rendition = index
            .renditions
            .iter()
            .find(|r| r.name == board.rendition)
            .expect("the board's rendition is the index's");

        // The cues by the segment they fall in (by its start), in order.
        let mut by_segment: BTreeMap<u64, (IndexedSegment, Vec<u64>)> = BTreeMap::new();
        for cue in &board.cues {
            let pts = board.cue_pts(cue);
            let segment = rendition.segment_at(pts).expect("a rendition has segments");
            by_segment
                .entry(segment.start)
                .or_insert_with(|| (segment.clone(), Vec::new()))
                .1
                .push(pts);
        }
        let name = &rendition.name;
        let reads: Vec<_> = by_segment
            .into_values()
            .map(|(segment, wanted)| {
                read_piece(input, format!("{name}/{}", segment.name), segment, wanted)
            })
            .collect();
        let pieces: Vec<Piece> = futures::stream::iter(reads)
            .buffered(READS_AT_ONCE)
            .try_collect()
            .await?;

        // Each distinct frame once, in presentation order.
        let cue_frames: Vec<u64> = pieces.iter().flat_map(|p| p.frames.clone()).collect();
        let mut distinct = cue_frames.clone();
        distinct.dedup();
        let tile_bytes = board.tile_width as usize * board.tile_height as usize * 3;
        let stream: Vec<u8> = pieces.into_iter().flat_map(|p| p.bytes).collect();
        let pixels = run(
            &self.ffmpeg,
            &ffmpeg_args(&distinct, board.tile_width, board.tile_height),
            &std::env::temp_dir(),
            stream,
            distinct.len() * tile_bytes,
            time_left(context),
        )
        .await
        .map_err(|failure| match failure {
            // The package's own segments, checked by hash: not the
            // upload's fault, and retried.
            Failure::Output(why) => {
                StepError::Failed(format!("storyboard: decoding {name}'s segments: {why}"))
            }
            Failure::Step(e) => e,
        })?;
        let tile_of = |pts: u64| {
            let at = distinct.binary_search(&pts).expect("a distinct frame");
            &pixels[at * tile_bytes..(at + 1) * tile_bytes]
        };

        for (number, sheet) in board.sheets.iter().enumerate() {
            let mut canvas = image::RgbImage::new(sheet.width, sheet.height);
            for (cue, &pts) in board.cues.iter().zip(&cue_frames) {
                if cue.sheet != number {
                    continue;
                }
                let tile = image::RgbImage::from_raw(
                    board.tile_width,
                    board.tile_height,
                    tile_of(pts).to_vec(),
                )
                .expect("a whole tile");
                image::imageops::replace(&mut canvas, &tile, cue.x.into(), cue.y.into());
            }
            let bytes = encode(canvas, params)?;
            outputs
                .put_bytes(&sheet.name, content_type(&sheet.name), bytes)
                .await?;
        }
        let vtt = board.vtt();
        outputs
            .put_bytes(
                plan::VTT_NAME,
                content_type(plan::VTT_NAME),
                vtt.into_bytes(),
            )
            .await
    }
}

/// Reads the segment at `path` beside the index, checked, and cuts its
/// piece for `wanted` ([`piece`]).
async fn read_piece(
    input: &crate::step::JobInput,
    path: String,
    segment: IndexedSegment,
    wanted: Vec<u64>,
) -> Result<Piece, StepError> {
    let bytes = input
        .read_beside(&path, segment.bytes, &segment.sha256)
        .await?;
    piece(&path, &segment, bytes, &wanted)
}

/// A segment's piece for `wanted` cue times: the frames they show (its
/// TS read for its frames' times), and its keyframe's range alone when
/// that is all they show.
fn piece(
    path: &str,
    segment: &IndexedSegment,
    mut bytes: Vec<u8>,
    wanted: &[u64],
) -> Result<Piece, StepError> {
    let measured = ts::read_segment(&bytes)
        .map_err(|e| StepError::Failed(format!("storyboard: {path}: {e}")))?;
    let frames: Vec<u64> = wanted
        .iter()
        .map(|&pts| plan::frame_at(&measured.video_pts, pts))
        .collect::<Option<_>>()
        .ok_or_else(|| StepError::Failed(format!("storyboard: {path} holds no frame")))?;
    let first = measured.video_pts[0];
    if let Some(end) = segment.keyframe_bytes {
        if frames.iter().all(|&f| f == first) && end <= bytes.len() as u64 {
            bytes.truncate(end as usize);
        }
    }
    Ok(Piece { bytes, frames })
}

/// ffmpeg's arguments: the pieces on stdin as one MPEG-TS stream, the
/// `frames` (90 kHz presentation times, as the segments carry them:
/// `-copyts`) picked out and scaled to `width`×`height`, as raw RGB on
/// stdout. One thread, bit-exact scaling: the same tiles on every run.
pub fn ffmpeg_args(frames: &[u64], width: u32, height: u32) -> Vec<String> {
    let picked: Vec<String> = frames.iter().map(|pts| format!("eq(pts,{pts})")).collect();
    let filter = format!(
        "select='{}',scale={width}:{height}:flags=lanczos+accurate_rnd+full_chroma_int+bitexact,\
         format=rgb24",
        picked.join("+")
    );
    [
        "-hide_banner",
        "-nostdin",
        "-loglevel",
        "error",
        // The pieces are the package's own segments, checked by hash; even
        // so ffmpeg reads nothing but the pipe, as MPEG-TS.
        "-protocol_whitelist",
        "pipe",
        "-threads",
        "1",
        "-copyts",
        "-f",
        "mpegts",
        "-i",
        "pipe:0",
        "-map",
        "0:v:0",
        "-filter_threads",
        "1",
        "-vf",
        &filter,
        "-fps_mode",
        "passthrough",
        "-f",
        "rawvideo",
        "-pix_fmt",
        "rgb24",
        "pipe:1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A sheet, encoded as the params say, by the encoder thumbnails use.
fn encode(canvas: image::RgbImage, params: &StoryboardParams) -> Result<Vec<u8>, StepError> {
    let format = match params.format {
        SheetFormat::Jpeg => Format::Jpeg,
        SheetFormat::Webp => Format::Webp,
    };
    let encoding = Encoding {
        format,
        quality: params.quality,
        progressive: false,
    };
    thumbnail::encode(&image::DynamicImage::ImageRgb8(canvas), encoding)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ffmpeg_picks_the_cues_frames_from_the_pipe_alone() {
        let args = ffmpeg_args(&[900_000, 1_440_000], 256, 144).join(" ");
        assert!(args.contains("-protocol_whitelist pipe "));
        assert!(args.contains("-copyts -f mpegts -i pipe:0 -map 0:v:0 "));
        assert!(args
            .contains("-vf select='eq(pts,900000)+eq(pts,1440000)',scale=256:144:flags=lanczos"));
        assert!(args.ends_with("-f rawvideo -pix_fmt rgb24 pipe:1"));
    }
}
