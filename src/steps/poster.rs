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
use std::time::Duration;

use serde_json::{Map, Value};

use super::ffmpeg::{ffmpeg_from, run_to_end, time_left, MovieScratch, STOP_BEFORE_DEADLINE};
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
            ffmpeg: ffmpeg_from(lookup),
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
        InputUse::File {
            max_bytes: u64::MAX,
        }
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
        let scratch =
            MovieScratch::prepare(&self.scratch, SCRATCH_RESERVE_BYTES, context, "poster").await?;
        let movie = &scratch.movie;
        if movie.video().is_none() {
            return Err(StepError::Unprocessable(
                "poster needs a video track; the input has none (audio only?)".into(),
            ));
        }
        let seconds = params.seconds_in(movie.duration);
        let output = scratch.dir.join(POSTER_NAME);
        let args = poster_args(&scratch.input, seconds, &output);
        run_to_end(
            &self.ffmpeg,
            &args,
            &scratch.dir,
            time_left(context),
            |_| {},
        )
        .await
        .map_err(|failure| failure.into_step_error("", ""))?;
        if !output.exists() {
            return Err(StepError::Unprocessable(format!(
                "ffmpeg decoded no frame at {seconds:.3} s of a {:.3} s video",
                movie.duration.unwrap_or_default()
            )));
        }
        outputs.put_file(POSTER_NAME, "image/jpeg", &output).await
    }
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
