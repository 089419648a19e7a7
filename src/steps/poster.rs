//! `poster`: a representative frame of a video as a JPEG at the source's
//! resolution (rotation applied), through the pinned ffmpeg with the same
//! hardening as `hls-package`: a cleared environment, the `mov` demuxer
//! forced (the upload is read only as the MP4/MOV its `moov` says it is),
//! local files only, and killed before the invocation deadline.
//!
//! Params (one of `at` and `seconds`; default `{"at": 0.1}`):
//! - `at`: a fraction of the duration, from 0 up to (not including) 1;
//! - `seconds`: a time from the start (a time past the end takes the last
//!   frames).
//!
//! Deterministic: an accurate seek (decoded from the keyframe before the
//! time), bit-exact flags and no metadata, so a retry writes the same
//! bytes. Its one output is `poster.jpg`, which a chained recipe can read
//! (`"input": {"recipe": "poster", "file": "poster.jpg"}`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::io::AsyncReadExt;

use super::hls::{read_movie_for, spawn_ffmpeg, ScratchDir, ENV_FFMPEG, STOP_BEFORE_DEADLINE};
use crate::step::{InputUse, JobOutputs, Step, StepContext, StepError};

/// The output's name.
pub const POSTER_NAME: &str = "poster.jpg";

/// What a run may take at most, declared so that none starts that the
/// deadline would cut off: a seek and one decoded frame, generously.
const TIME_NEEDED: Duration = Duration::from_secs(30);

/// Room kept free beyond the input for the frame.
const SCRATCH_RESERVE_BYTES: u64 = 16 * 1024 * 1024;

/// Where in the video the frame is taken.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PosterAt {
    /// A fraction of the duration.
    Fraction(f64),
    /// Seconds from the start.
    Seconds(f64),
}

impl PosterAt {
    pub fn from_params(params: &Map<String, Value>) -> Result<Self, String> {
        if let Some(unknown) = params
            .keys()
            .find(|k| !matches!(k.as_str(), "at" | "seconds"))
        {
            return Err(format!(
                "unknown param {unknown:?} (expected at, or seconds)"
            ));
        }
        let number = |name: &str| -> Result<Option<f64>, String> {
            match params.get(name) {
                None => Ok(None),
                Some(v) => v
                    .as_f64()
                    .filter(|n| n.is_finite() && *n >= 0.0)
                    .map(Some)
                    .ok_or_else(|| format!("{name} must be a number of 0 or more, got {v}")),
            }
        };
        match (number("at")?, number("seconds")?) {
            (Some(_), Some(_)) => Err("give at (a fraction) or seconds, not both".into()),
            (Some(at), None) if at >= 1.0 => Err(format!(
                "at is a fraction of the duration, from 0 up to (not including) 1, got {at}"
            )),
            (Some(at), None) => Ok(PosterAt::Fraction(at)),
            (None, Some(seconds)) => Ok(PosterAt::Seconds(seconds)),
            (None, None) => Ok(PosterAt::Fraction(0.1)),
        }
    }

    /// The time to seek to in a video of `duration` seconds (unknown: the
    /// start): never past the last tenth of a second, where a seek finds
    /// no frame. Pure.
    pub fn seconds_in(self, duration: Option<f64>) -> f64 {
        let Some(duration) = duration.filter(|d| d.is_finite() && *d > 0.0) else {
            return 0.0;
        };
        let wanted = match self {
            PosterAt::Fraction(at) => at * duration,
            PosterAt::Seconds(seconds) => seconds,
        };
        wanted.min((duration - 0.1).max(0.0))
    }
}

/// ffmpeg's arguments: one frame of `input` at `seconds` into `output`.
/// Pure.
pub fn poster_args(input: &Path, seconds: f64, output: &Path) -> Vec<String> {
    let mut args: Vec<String> = [
        "-hide_banner",
        "-nostdin",
        "-y",
        "-loglevel",
        "error",
        // The upload is untrusted: read only as the MP4/MOV bmff accepted,
        // opening nothing but local files.
        "-protocol_whitelist",
        "file",
        "-f",
        "mov",
        "-ss",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(format!("{seconds:.3}"));
    args.push("-i".into());
    args.push(input.display().to_string());
    args.extend(
        [
            "-map",
            "0:v:0",
            "-frames:v",
            "1",
            "-an",
            "-sn",
            "-dn",
            "-map_metadata",
            "-1",
            "-fflags",
            "+bitexact",
            "-flags:v",
            "+bitexact",
            "-c:v",
            "mjpeg",
            "-q:v",
            "2",
            "-pix_fmt",
            "yuvj420p",
            "-f",
            "image2",
            "-update",
            "1",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    args.push(output.display().to_string());
    args
}

/// The step.
#[derive(Debug, Clone)]
pub struct Poster {
    pub ffmpeg: PathBuf,
    pub scratch: PathBuf,
}

impl Poster {
    /// ffmpeg from `MEDIAONCE_FFMPEG` (read through `lookup`) or PATH;
    /// scratch in the system's temporary directory.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        Poster {
            ffmpeg: lookup(ENV_FFMPEG)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("ffmpeg")),
            scratch: std::env::temp_dir(),
        }
    }
}

#[async_trait::async_trait]
impl Step for Poster {
    fn name(&self) -> &'static str {
        "poster"
    }

    type Params = PosterAt;

    fn params(&self, params: &Map<String, Value>) -> Result<PosterAt, String> {
        PosterAt::from_params(params)
    }

    fn input_use(&self, _params: &PosterAt) -> InputUse {
        InputUse::File
    }

    fn time_needed(&self, _params: &PosterAt) -> Duration {
        TIME_NEEDED + STOP_BEFORE_DEADLINE
    }

    async fn run(
        &self,
        params: &PosterAt,
        context: &StepContext<'_>,
        outputs: &mut JobOutputs,
    ) -> Result<(), StepError> {
        let input = context.input;
        let spooled = if input.is_in_file() {
            0
        } else {
            input.head.size
        };
        crate::step::scratch::ensure_room(&self.scratch, spooled, SCRATCH_RESERVE_BYTES)
            .map_err(StepError::Failed)?;
        // Named by the job: a crashed attempt's leftovers are replaced.
        let dir = self.scratch.join(format!("mediaonce-{}", context.job_key));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| StepError::Failed(format!("creating {}: {e}", dir.display())))?;
        let _cleanup = ScratchDir(dir.clone());
        let input_path = dir.join("input");
        input.spool_to(&input_path).await?;

        let movie = read_movie_for(&input_path, "poster").await?;
        if let Some(reference) = movie.external_data() {
            return Err(StepError::Unprocessable(format!(
                "poster refuses a movie whose data is outside the file ({reference}): \
                 ffmpeg would be asked to open it"
            )));
        }
        if movie.video().is_none() {
            return Err(StepError::Unprocessable(
                "poster needs a video track; the input has none (audio only?)".into(),
            ));
        }
        let seconds = params.seconds_in(movie.duration);
        let output = dir.join(POSTER_NAME);
        let args = poster_args(&input_path, seconds, &output);
        let time_left = context
            .deadline_ms
            .map(|deadline| Duration::from_millis(deadline.saturating_sub(context.clock.now_ms())));
        run_to_end(&self.ffmpeg, &args, &dir, time_left).await?;
        if !output.exists() {
            return Err(StepError::Unprocessable(format!(
                "ffmpeg decoded no frame at {seconds:.3} s of a {:.3} s video",
                movie.duration.unwrap_or_default()
            )));
        }
        outputs.put_file(POSTER_NAME, "image/jpeg", &output).await
    }
}

/// Runs ffmpeg to its end, killed [`STOP_BEFORE_DEADLINE`] before
/// `time_left` runs out; its last error lines make the failure's message.
async fn run_to_end(
    ffmpeg: &Path,
    args: &[String],
    scratch: &Path,
    time_left: Option<Duration>,
) -> Result<(), StepError> {
    let mut child = spawn_ffmpeg(ffmpeg, args, scratch, Stdio::null())?;
    let mut stderr = child.stderr.take().expect("piped stderr");
    let errors = tokio::spawn(async move {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text).await;
        text
    });
    let status = match time_left {
        Some(left) => {
            match tokio::time::timeout(left.saturating_sub(STOP_BEFORE_DEADLINE), child.wait())
                .await
            {
                Ok(status) => status,
                Err(_) => {
                    let _ = child.kill().await;
                    return Err(StepError::Failed(format!(
                        "ffmpeg stopped {} s before the invocation deadline, unfinished; \
                         the job is retried",
                        STOP_BEFORE_DEADLINE.as_secs()
                    )));
                }
            }
        }
        None => child.wait().await,
    }
    .map_err(|e| StepError::Failed(format!("waiting for ffmpeg: {e}")))?;
    if !status.success() {
        let stderr = errors.await.unwrap_or_default();
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(StepError::Failed(format!(
            "ffmpeg failed ({status}): {}",
            tail.join(" | ")
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(value: Value) -> Result<PosterAt, String> {
        PosterAt::from_params(value.as_object().unwrap())
    }

    #[test]
    fn params_a_fraction_or_seconds() {
        assert_eq!(at(json!({})), Ok(PosterAt::Fraction(0.1)));
        assert_eq!(at(json!({"at": 0.5})), Ok(PosterAt::Fraction(0.5)));
        assert_eq!(at(json!({"seconds": 3})), Ok(PosterAt::Seconds(3.0)));
        for (bad, problem) in [
            (json!({"at": 1}), "up to (not including) 1"),
            (json!({"at": -0.1}), "0 or more"),
            (json!({"seconds": "3"}), "must be a number"),
            (json!({"at": 0.1, "seconds": 2}), "not both"),
            (json!({"frame": 2}), "unknown param \"frame\""),
        ] {
            let err = at(bad).unwrap_err();
            assert!(err.contains(problem), "{err}");
        }
    }

    #[test]
    fn the_time_stays_inside_the_video() {
        assert_eq!(PosterAt::Fraction(0.5).seconds_in(Some(10.0)), 5.0);
        assert_eq!(PosterAt::Seconds(3.0).seconds_in(Some(10.0)), 3.0);
        assert!((PosterAt::Seconds(30.0).seconds_in(Some(10.0)) - 9.9).abs() < 1e-9);
        assert_eq!(PosterAt::Fraction(0.5).seconds_in(None), 0.0);
        assert_eq!(PosterAt::Seconds(1.0).seconds_in(Some(0.05)), 0.0);
    }

    #[test]
    fn one_frame_of_the_mov_demuxer_from_local_files_only() {
        let args = poster_args(Path::new("/s/in"), 2.5, Path::new("/s/poster.jpg")).join(" ");
        assert!(
            args.contains("-protocol_whitelist file -f mov -ss 2.500 -i /s/in "),
            "{args}"
        );
        assert!(args.contains("-frames:v 1"), "{args}");
        assert!(args.contains("+bitexact"), "{args}");
        assert!(args.ends_with("/s/poster.jpg"), "{args}");
    }
}
