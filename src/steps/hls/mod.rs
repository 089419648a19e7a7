//! `hls-package`: an MP4/MOV into an HLS ladder with ffmpeg.
//!
//! The input is spooled to local scratch space (checked against the free
//! space first: ffmpeg seeks, and a `moov` at the end needs the whole file),
//! its video track read from its `moov` ([`crate::bmff`]), and the input is
//! encoded in the spans of its plan ([`chunk`]), one ffmpeg run each, every
//! run encoding every rendition of the ladder at or below the video's
//! height: H.264 + AAC in MPEG-TS segments, keyframes forced at segment
//! boundaries so every rendition cuts at the same instants. The playlists
//! are then written from the segments as measured ([`playlist`]). The
//! outputs are `master.m3u8` and, per rendition, `<height>p/index.m3u8` and
//! `<height>p/seg-NNNNN.ts`.
//!
//! Deterministic: bit-exact flags, no metadata, a fixed encoder thread count
//! in slices (x264's output depends on the count, and its frame threads
//! are not repeatable) and fixed names, so a retry writes the same bytes.
//! ffmpeg is killed before the invocation deadline (the job fails and is
//! retried) and when the step is dropped; its progress is logged.

pub mod chunk;
pub mod chunk_job;
pub mod index;
pub mod join;
mod params;
pub mod playlist;
pub mod sparse;
pub mod ts;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

use super::ffmpeg::{
    ffmpeg_from, refuse_external_data, run_to_end, time_left, MovieScratch, STOP_BEFORE_DEADLINE,
};
use super::movie_error;
pub use chunk::Span;
pub use params::{plan_renditions, Height, HlsParams, Rendition};

use crate::step::{content_type, ChunkSpan, InputUse, JobOutputs, Step, StepContext, StepError};

/// Scratch space kept free beyond the input by default, for ffmpeg's
/// outputs and the playlists.
pub const SCRATCH_RESERVE_BYTES: u64 = 64 * 1024 * 1024;

/// The largest upload read whole to key it (and kept for ffmpeg): 1 GiB,
/// half the template's `/tmp`, and seconds to read. A larger one is keyed
/// without a whole read; split, its chunks read only their spans.
pub const WHOLE_READ_MAX_BYTES: u64 = 1 << 30;

/// How often progress is logged.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Added to every output timestamp: more than any encoder delay (x264's
/// B-frames), so that no decode timestamp is negative and ffmpeg never
/// shifts a run's timeline to make it so. A run that starts at the input's
/// beginning would be shifted and one that starts later would not; with
/// the offset every run, whole or a chunk, keeps the input's own timeline.
pub const TIMELINE_OFFSET_SECS: u32 = 10;

/// ffmpeg's arguments: the `span` of `input` into `out_dir`, one run for
/// the whole ladder; audio (when the input has it, at `audio_rate` samples
/// a second) muxed into each rendition's segments. Pure.
pub fn ffmpeg_args(
    params: &HlsParams,
    renditions: &[Rendition],
    audio_rate: Option<u32>,
    span: &Span,
    input: &Path,
    out_dir: &Path,
) -> Vec<String> {
    let n = renditions.len();
    let mut args: Vec<String> = [
        "-hide_banner",
        "-nostdin",
        "-y",
        "-loglevel",
        "error",
        "-nostats",
        "-progress",
        "pipe:1",
        // The upload is untrusted: read it only as the MP4/MOV that bmff
        // accepted (no probing into HLS or concat playlists, which name
        // other files and URLs), and open nothing but local files.
        "-protocol_whitelist",
        "file",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // Seek to just before the span (ffmpeg decodes from the keyframe
    // before it and drops what precedes the seek); the filters then keep
    // exactly the span's frames and samples on the input's own timeline
    // (-copyts below). See `chunk`.
    if let Some(seek) = span.seek_ms(audio_rate) {
        args.extend(["-ss".into(), chunk::format_ms(seek)]);
    }
    args.extend(["-f".into(), "mov".into(), "-i".into()]);
    args.push(input.display().to_string());

    let mut graph = String::from("[0:v]");
    if let Some(trim) = span.trim_filter() {
        graph.push_str(&trim);
        graph.push(',');
    }
    graph.push_str(&format!("split={n}"));
    for i in 0..n {
        graph.push_str(&format!("[s{i}]"));
    }
    for (i, rendition) in renditions.iter().enumerate() {
        // -2: the width that keeps the aspect ratio, rounded to even.
        graph.push_str(&format!(";[s{i}]scale=-2:{}[v{i}]", rendition.height));
    }
    let audio = audio_rate.map(|rate| span.audio_cut(rate));
    if let Some(cut) = &audio {
        graph.push_str(&format!(";[0:a:0]{},asplit={n}", cut.filter()));
        for i in 0..n {
            graph.push_str(&format!("[a{i}]"));
        }
    }
    args.extend(["-filter_complex".into(), graph]);

    for (i, rendition) in renditions.iter().enumerate() {
        args.extend([
            "-map".into(),
            format!("[v{i}]"),
            format!("-c:v:{i}"),
            "libx264".into(),
            format!("-crf:v:{i}"),
            params.crf.to_string(),
            // Keyframes exactly at segment boundaries (the span's list of
            // absolute times), none elsewhere (see -sc_threshold and -g):
            // renditions switch cleanly at every segment, and the muxer
            // (cutting at every keyframe, see -hls_time) cuts where the
            // recipe says whatever the run's start. Per stream: ffmpeg
            // 7.0 applies an unqualified list to the first stream only.
            format!("-force_key_frames:v:{i}"),
            span.keyframe_list(),
        ]);
        if let Some(max) = rendition.max_kbps {
            args.extend([
                format!("-maxrate:v:{i}"),
                format!("{max}k"),
                format!("-bufsize:v:{i}"),
                format!("{}k", max * 2),
            ]);
        }
    }
    if let Some(cut) = &audio {
        for i in 0..n {
            args.extend([
                "-map".into(),
                format!("[a{i}]"),
                format!("-c:a:{i}"),
                "aac".into(),
                format!("-b:a:{i}"),
                format!("{}k", params.audio_kbps),
                format!("-ac:a:{i}"),
                "2".into(),
            ]);
            if let Some(drop) = cut.drop_filter() {
                args.extend([format!("-bsf:a:{i}"), drop]);
            }
        }
    }
    args.extend(
        [
            "-preset",
            &params.preset,
            "-pix_fmt",
            "yuv420p",
            "-profile:v",
            "high",
            // No keyframe but the forced ones: none at scene cuts, and a
            // GOP longer than any segment.
            "-sc_threshold",
            "0",
            "-g",
            "1000000",
            "-threads",
            &params.threads.to_string(),
            // Threads share each frame (slices), not frames: x264's frame
            // threads with its lookahead write different bytes run to run
            // (measured: 20 of 40 segments of a 180p clip differ between
            // two runs; sliced, none), and a job's bytes must be a function
            // of its input and recipe.
            "-x264-params",
            "sliced-threads=1",
            "-filter_threads",
            "1",
            // Every frame with the input's own timestamp, none duplicated
            // or dropped to make a constant rate.
            "-fps_mode",
            "passthrough",
            // Same input and recipe, same bytes: no encoder version strings,
            // no metadata or chapters carried over.
            "-fflags",
            "+bitexact",
            "-flags:v",
            "+bitexact",
            "-flags:a",
            "+bitexact",
            "-map_metadata",
            "-1",
            "-map_chapters",
            "-1",
            // The input's own timeline, offset: a chunk's frames keep the
            // times they have in a whole run (without -copyts, the first
            // frame after a seek would be moved to the seek's time).
            "-copyts",
            "-output_ts_offset",
            &TIMELINE_OFFSET_SECS.to_string(),
            "-f",
            "hls",
            // Below a frame: the muxer counts its cuts from the run's first
            // packet, so a segment length would cut a chunk elsewhere than a
            // whole run; this cuts at every keyframe, and only forced ones
            // exist.
            "-hls_time",
            "0.1",
            "-start_number",
            &span.first_segment.to_string(),
            "-hls_playlist_type",
            "vod",
            "-hls_flags",
            "independent_segments",
            "-hls_segment_type",
            "mpegts",
            // Each run's segments start every PID's continuity counter at
            // 0, so where a chunk's segments follow another's the counter
            // jumps: flagged as a discontinuity on each PID's first packet,
            // a strict demuxer takes it (ffmpeg's said `Packet corrupt`).
            "-hls_segment_options",
            "mpegts_flags=+initial_discontinuity",
            "-hls_segment_filename",
            &out_dir.join("%v/seg-%05d.ts").display().to_string(),
            "-var_stream_map",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    let map: Vec<String> = renditions
        .iter()
        .enumerate()
        .map(|(i, r)| {
            if audio.is_some() {
                format!("v:{i},a:{i},name:{}", r.name())
            } else {
                format!("v:{i},name:{}", r.name())
            }
        })
        .collect();
    args.push(map.join(" "));
    args.push(out_dir.join("%v/index.m3u8").display().to_string());
    args
}

/// Seconds as ffmpeg reads them, without a float's noise: 6, 2.5.
pub(crate) fn format_seconds(seconds: f64) -> String {
    let text = format!("{seconds:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// ffmpeg's `-progress` output, a `key=value` line at a time. Pure.
///
/// Counted in frames: with `-copyts` ffmpeg 7 reports `out_time` (and so
/// `speed`) as 0.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Progress {
    /// Frames encoded so far (of the first output stream).
    pub frames: u64,
    pub finished: bool,
}

impl Progress {
    /// Takes one line; true at the end of a block (`progress=…`).
    pub fn feed(&mut self, line: &str) -> bool {
        let Some((key, value)) = line.trim().split_once('=') else {
            return false;
        };
        match key {
            "frame" => {
                if let Ok(frames) = value.trim().parse() {
                    self.frames = frames;
                }
            }
            "progress" => {
                self.finished = value == "end";
                return true;
            }
            _ => {}
        }
        false
    }

    /// Seconds of input encoded, at `frame_rate` frames a second.
    pub fn encoded_secs(&self, frame_rate: f64) -> f64 {
        if frame_rate > 0.0 {
            self.frames as f64 / frame_rate
        } else {
            0.0
        }
    }
}

pub use crate::step::scratch::{check_fits, free_bytes};

/// The step. `ffmpeg` is run for each job; `scratch` holds its files, and
/// must have the input's size plus `scratch_reserve` free.
#[derive(Debug, Clone)]
pub struct HlsPackage {
    pub ffmpeg: PathBuf,
    pub scratch: PathBuf,
    pub scratch_reserve: u64,
}

impl HlsPackage {
    /// ffmpeg from `MEDIAONCE_FFMPEG` or PATH; scratch in the system's
    /// temporary directory (`/tmp` in Lambda, `TMPDIR` if set).
    pub fn from_env() -> Self {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// The same, with `MEDIAONCE_FFMPEG` read through `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        HlsPackage {
            ffmpeg: ffmpeg_from(lookup),
            scratch: std::env::temp_dir(),
            scratch_reserve: SCRATCH_RESERVE_BYTES,
        }
    }
}

#[async_trait::async_trait]
impl Step for HlsPackage {
    fn name(&self) -> &'static str {
        "hls-package"
    }

    type Params = HlsParams;

    fn params(&self, params: &Map<String, Value>) -> Result<HlsParams, String> {
        HlsParams::from_params(params)
    }

    /// Whole, up to [`WHOLE_READ_MAX_BYTES`]: the read that keys it is
    /// the one ffmpeg's input comes from. A larger upload is keyed without
    /// reading it (S3's SHA-256, a cached hash, or its version and ETag),
    /// and its chunks read only their spans; run whole, it spools itself.
    fn input_use(&self, _params: &HlsParams) -> InputUse {
        InputUse::File {
            max_bytes: WHOLE_READ_MAX_BYTES,
        }
    }

    fn time_needed(&self, params: &HlsParams) -> Duration {
        Duration::from_secs(params.min_seconds) + STOP_BEFORE_DEADLINE
    }

    /// An input whose plan has more than one span is split: each span a
    /// chunk job (`hls-chunk`), read from the `moov` alone (ranged reads).
    async fn split(
        &self,
        params: &HlsParams,
        context: &StepContext<'_>,
    ) -> Result<Option<Vec<ChunkSpan>>, StepError> {
        let input = context.input;
        let unreadable = |e| movie_error(e, "hls-package reads MP4/MOV inputs");
        let boxes = crate::bmff::locate_movie(input, input.head.size, &[])
            .await
            .map_err(unreadable)?;
        let movie = crate::bmff::parse_boxes(&boxes).map_err(unreadable)?;
        refuse_external_data(&movie, "hls-package")?;
        let spans = Encoding::of(&movie, params)?.spans(params);
        Ok((spans.len() > 1).then(|| {
            spans
                .iter()
                .map(|span| ChunkSpan {
                    index: span.index,
                    start_ms: span.start_ms,
                    end_ms: span.end_ms,
                })
                .collect()
        }))
    }

    async fn run(
        &self,
        params: &HlsParams,
        context: &StepContext<'_>,
        outputs: &mut JobOutputs,
    ) -> Result<(), StepError> {
        let scratch =
            MovieScratch::prepare(&self.scratch, self.scratch_reserve, context, "hls-package")
                .await?;
        let encoding = Encoding::of(&scratch.movie, params)?;
        let out_dir = scratch.dir.join("out");
        std::fs::create_dir_all(&out_dir)
            .map_err(|e| StepError::Failed(format!("creating {}: {e}", out_dir.display())))?;
        // The plan's spans one after another: the same runs, so the same
        // bytes, as when the spans run in separate invocations.
        for span in encoding.spans(params) {
            encode_span(
                &self.ffmpeg,
                params,
                &encoding,
                &span,
                &scratch.input,
                &out_dir,
                time_left(context),
                context.job_key,
            )
            .await?;
        }
        let names = encoding.renditions.iter().map(Rendition::name).collect();
        let dir = out_dir.clone();
        let iframes = params.iframes;
        tokio::task::spawn_blocking(move || write_playlists(&dir, names, iframes))
            .await
            .map_err(|e| StepError::Failed(format!("measuring the segments: {e}")))??;
        upload_dir(&out_dir, outputs).await
    }
}

/// What every ffmpeg run of one input and recipe shares, read from the
/// input's `moov`.
#[derive(Debug, Clone, PartialEq)]
pub struct Encoding {
    pub renditions: Vec<Rendition>,
    /// The audio track's sample rate, if there is audio.
    pub audio_rate: Option<u32>,
    /// Frames per second (0 when unknown): progress in seconds.
    pub frame_rate: f64,
    /// Where the plan's spans lie: past the last frame's start (the video
    /// track's duration less a frame), so that every span holds a frame
    /// (a longer audio track's tail goes into the last one, as in one run).
    pub plan_ms: u64,
    /// The video track's duration (ms): how much a run has to encode.
    pub duration_ms: u64,
}

impl Encoding {
    /// The encoding of `movie` under `params`, or why it cannot be.
    pub fn of(movie: &crate::bmff::MovieInfo, params: &HlsParams) -> Result<Self, StepError> {
        let Some(video) = movie.video() else {
            return Err(StepError::Unprocessable(
                "hls-package needs a video track; the input has none".into(),
            ));
        };
        let (Some(width), Some(height)) = (video.width, video.height) else {
            return Err(StepError::Unprocessable(
                "the video track does not say its size".into(),
            ));
        };
        let Some(duration) = video
            .duration
            .or(movie.duration)
            .filter(|d| d.is_finite() && *d >= 0.0)
        else {
            return Err(StepError::Unprocessable(
                "the video track does not say its duration".into(),
            ));
        };
        let frame_rate = video.frame_rate.unwrap_or(0.0);
        let frame_ms = if frame_rate > 0.0 {
            1000.0 / frame_rate
        } else {
            0.0
        };
        // ffmpeg turns rotated video upright: the displayed height counts.
        let displayed = match video.rotation {
            Some(90 | 270) => width,
            _ => height,
        };
        Ok(Encoding {
            renditions: plan_renditions(params, displayed),
            // Unknown, 48 kHz: the rate places audio cuts, and a whole
            // span has none.
            audio_rate: movie
                .audio()
                .map(|audio| audio.sample_rate.unwrap_or(48_000)),
            frame_rate,
            plan_ms: ((duration * 1000.0 - frame_ms).floor().max(0.0) as u64) + 1,
            duration_ms: (duration * 1000.0).round() as u64,
        })
    }

    /// The spans the input is encoded in ([`chunk::plan`]).
    pub fn spans(&self, params: &HlsParams) -> Vec<Span> {
        chunk::plan(self.plan_ms, params.segment_ms(), params.chunk_ms())
    }
}

/// Encodes `span` of `input` into the package at `out_dir` (one ffmpeg
/// run, its working directory `out_dir`'s parent), ffmpeg stopped before
/// `time_left` runs out, its progress logged for `job_key`.
#[allow(clippy::too_many_arguments)]
pub async fn encode_span(
    ffmpeg: &Path,
    params: &HlsParams,
    encoding: &Encoding,
    span: &Span,
    input: &Path,
    out_dir: &Path,
    time_left: Option<Duration>,
    job_key: &str,
) -> Result<(), StepError> {
    let args = ffmpeg_args(
        params,
        &encoding.renditions,
        encoding.audio_rate,
        span,
        input,
        out_dir,
    );
    let clock = FrameClock {
        frame_rate: encoding.frame_rate,
        total_secs: Some(
            (span.end_ms.unwrap_or(encoding.duration_ms)).saturating_sub(span.start_ms) as f64
                / 1000.0,
        ),
    };
    let workdir = out_dir.parent().unwrap_or(out_dir);
    run_logging_progress(ffmpeg, &args, workdir, clock, time_left, job_key).await
}

/// Rewrites each rendition's media playlist and the master playlist from
/// the segments as measured ([`playlist`]), in place of the muxer's: real
/// durations, and the master's peak and average bit rates, codecs,
/// resolution and frame rate; with `iframes`, each rendition's I-frame
/// playlist too; and writes the package's index ([`index`]).
pub fn write_playlists(
    out_dir: &Path,
    renditions: Vec<String>,
    iframes: bool,
) -> Result<(), StepError> {
    let failed = |what: String| StepError::Failed(format!("hls-package: {what}"));
    let (summaries, sha256) = measure_segments(out_dir, renditions)?;
    for (path, text) in index::package_texts(&summaries, &sha256, iframes).map_err(failed)? {
        std::fs::write(out_dir.join(&path), text)
            .map_err(|e| failed(format!("writing {path}: {e}")))?;
    }
    Ok(())
}

/// A rendition's segment summaries, by rendition.
pub type MeasuredRenditions = Vec<(String, Vec<playlist::SegmentSummary>)>;

/// Each rendition's segments under `out_dir` (`<rendition>/*.ts`, in name
/// order), measured ([`ts::read_segment`]) and summarised, and each one's
/// SHA-256 by its path in the package (`360p/seg-00000.ts`).
pub fn measure_segments(
    out_dir: &Path,
    renditions: Vec<String>,
) -> Result<(MeasuredRenditions, BTreeMap<String, String>), StepError> {
    let failed = |what: String| StepError::Failed(format!("hls-package: {what}"));
    let mut measured = Vec::with_capacity(renditions.len());
    let mut sha256 = BTreeMap::new();
    for name in renditions {
        let dir = out_dir.join(&name);
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .map_err(|e| failed(format!("listing {}: {e}", dir.display())))?
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|file| file.ends_with(".ts"))
            .collect();
        files.sort();
        let mut summaries = Vec::with_capacity(files.len());
        for file in files {
            let bytes = std::fs::read(dir.join(&file))
                .map_err(|e| failed(format!("reading {name}/{file}: {e}")))?;
            let segment =
                ts::read_segment(&bytes).map_err(|e| failed(format!("{name}/{file}: {e}")))?;
            sha256.insert(format!("{name}/{file}"), crate::key::sha256_hex(&bytes));
            summaries.push(
                playlist::SegmentSummary::of(&file, &segment)
                    .map_err(|e| failed(format!("{name}/{e}")))?,
            );
        }
        measured.push((name, summaries));
    }
    Ok((measured, sha256))
}

/// What progress in frames means in seconds.
#[derive(Debug, Clone, Copy)]
struct FrameClock {
    /// The input's frames per second (0 when unknown).
    frame_rate: f64,
    total_secs: Option<f64>,
}

/// Runs ffmpeg to its end ([`run_to_end`]), logging its progress.
async fn run_logging_progress(
    ffmpeg: &Path,
    args: &[String],
    scratch: &Path,
    clock: FrameClock,
    time_left: Option<Duration>,
    job_key: &str,
) -> Result<(), StepError> {
    let mut progress = Progress::default();
    let started = tokio::time::Instant::now();
    let mut logged = started;
    let run = run_to_end(ffmpeg, args, scratch, time_left, |line| {
        if progress.feed(line) && (logged.elapsed() >= PROGRESS_EVERY || progress.finished) {
            logged = tokio::time::Instant::now();
            let encoded = progress.encoded_secs(clock.frame_rate);
            tracing::info!(
                job_key,
                frames = progress.frames,
                encoded_secs = encoded,
                total_secs = clock.total_secs,
                speed = encoded / started.elapsed().as_secs_f64().max(1e-3),
                "hls-package: ffmpeg progress"
            );
        }
    })
    .await;
    run.map_err(|failure| {
        failure.into_step_error(
            " (raise the function timeout, or shorten the ladder)",
            &format!(
                " after {} frames ({:.1} s) of output",
                progress.frames,
                progress.encoded_secs(clock.frame_rate)
            ),
        )
    })
}

/// Uploads every file under `dir` by its relative path, in name order, the
/// playlists after the segments they list.
async fn upload_dir(dir: &Path, outputs: &mut JobOutputs) -> Result<(), StepError> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(at) = pending.pop() {
        let entries = std::fs::read_dir(&at)
            .map_err(|e| StepError::Failed(format!("listing {}: {e}", at.display())))?;
        for entry in entries {
            let path = entry
                .map_err(|e| StepError::Failed(format!("listing {}: {e}", at.display())))?
                .path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let name = path
                    .strip_prefix(dir)
                    .expect("under dir")
                    .to_string_lossy()
                    .into_owned();
                files.push((name.ends_with(".m3u8"), name, path));
            }
        }
    }
    files.sort();
    for (_, name, path) in files {
        outputs.put_file(&name, content_type(&name), &path).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params(value: Value) -> Result<HlsParams, String> {
        HlsParams::from_params(value.as_object().unwrap())
    }

    #[test]
    fn one_ffmpeg_run_for_the_ladder() {
        let p = params(json!({"ladder": [720, 360], "segment": 2})).unwrap();
        let r = plan_renditions(&p, 1080);
        let whole = Span::whole(7_000, 2_000);
        let args = ffmpeg_args(
            &p,
            &r,
            Some(48_000),
            &whole,
            Path::new("/s/in"),
            Path::new("/s/out"),
        );
        let joined = args.join(" ");
        assert!(joined.contains(
            "[0:v]split=2[s0][s1];[s0]scale=-2:720[v0];[s1]scale=-2:360[v1];\
             [0:a:0]aresample=first_pts=0,asplit=2[a0][a1] "
        ));
        assert!(joined.contains("-crf:v:1 23 -force_key_frames:v:1 0,2,4,6,8 "));
        assert!(joined.contains("-sc_threshold 0 -g 1000000 "));
        assert!(joined.contains("-threads 2 -x264-params sliced-threads=1 "));
        assert!(joined.contains("-copyts -output_ts_offset 10 -f hls"));
        assert!(joined.contains("-hls_time 0.1 -start_number 0 "));
        assert!(joined.contains("-var_stream_map v:0,a:0,name:720p v:1,a:1,name:360p"));
        assert!(joined.ends_with("/s/out/%v/index.m3u8"));
        assert!(!joined.contains("-bsf"));
        // The input is read as MP4/MOV from a local file, nothing else.
        assert!(joined.contains("-protocol_whitelist file -f mov -i /s/in "));
        // A chunk seeks to before its start and keeps its frames and
        // samples, nothing more, numbering its segments from its place.
        let span = &chunk::plan(10_000, 2_000, 4_000)[1];
        let chunk = ffmpeg_args(
            &p,
            &r,
            Some(48_000),
            span,
            Path::new("/s/in"),
            Path::new("/s/out"),
        );
        let chunk = chunk.join(" ");
        assert!(chunk.contains("-protocol_whitelist file -ss 3.945 -f mov -i /s/in "));
        assert!(chunk.contains("-filter_complex [0:v]trim=start=4:end=8,split=2[s0][s1];"));
        assert!(chunk.contains("[0:a:0]aresample=first_pts=189440,atrim=end_pts=386048,asplit=2"));
        assert!(chunk.contains("-bsf:a:1 noise=drop=lt(pts\\,191488)+gte(pts\\,384000)"));
        assert!(chunk.contains("-force_key_frames:v:0 4,6 "));
        assert!(chunk.contains("-start_number 2 "));
        let silent = ffmpeg_args(
            &p,
            &r,
            None,
            &whole,
            Path::new("/s/in"),
            Path::new("/s/out"),
        );
        assert!(!silent.join(" ").contains("[0:a:0]"));
        assert!(silent.join(" ").contains("v:0,name:720p v:1,name:360p"));
    }

    #[test]
    fn progress_lines() {
        let mut progress = Progress::default();
        assert!(!progress.feed("frame=50"));
        assert!(!progress.feed("out_time_us=0"));
        assert!(progress.feed("progress=continue"));
        assert_eq!(progress.encoded_secs(25.0), 2.0);
        assert_eq!(progress.encoded_secs(0.0), 0.0);
        assert!(!progress.finished);
        progress.feed("frame=N/A");
        assert!(progress.feed("progress=end"));
        assert!(progress.finished);
        assert_eq!(progress.frames, 50);
    }

    #[test]
    fn an_input_must_fit_beside_the_reserve() {
        let dir = Path::new("/tmp");
        assert!(check_fits(100, 100 + SCRATCH_RESERVE_BYTES, SCRATCH_RESERVE_BYTES, dir).is_ok());
        let err =
            check_fits(101, 100 + SCRATCH_RESERVE_BYTES, SCRATCH_RESERVE_BYTES, dir).unwrap_err();
        assert!(err.to_string().contains("does not fit in /tmp"), "{err}");
        assert!(free_bytes(dir).unwrap() > 0);
        assert!(free_bytes(Path::new("/no/such/dir")).is_err());
    }

    #[test]
    fn seconds_without_noise() {
        assert_eq!(format_seconds(6.0), "6");
        assert_eq!(format_seconds(2.5), "2.5");
        assert_eq!(format_seconds(0.1 + 0.2), "0.3");
    }
}
