//! The pinned ffmpeg as every step runs it: found once
//! ([`ffmpeg_from`]), started in a cleared environment and killed with its
//! job ([`spawn_ffmpeg`]), stopped before the invocation deadline and
//! reported by its last error lines ([`run_to_end`]); and the scratch
//! directory a movie step works in, with the upload spooled to it and its
//! `moov` read before ffmpeg sees a byte ([`MovieScratch`]).

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

pub mod piped;

use super::movie_error;
use crate::bmff;
use crate::step::{StepContext, StepError};

/// The ffmpeg binary; default `ffmpeg` on PATH (`/opt/bin/ffmpeg` from a
/// Lambda layer).
pub const ENV_FFMPEG: &str = "MEDIAONCE_FFMPEG";

/// ffmpeg is stopped this long before the invocation deadline, leaving time
/// to record the failure and answer the batch.
pub const STOP_BEFORE_DEADLINE: Duration = Duration::from_secs(10);

/// The ffmpeg binary named by `MEDIAONCE_FFMPEG` (read through `lookup`),
/// else `ffmpeg` on PATH.
pub fn ffmpeg_from(lookup: impl Fn(&str) -> Option<String>) -> PathBuf {
    lookup(ENV_FFMPEG)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("ffmpeg"))
}

/// The environment ffmpeg gets: nothing of the function's (its AWS
/// credentials above all, which an input-driven file read of
/// `/proc/self/environ` would otherwise expose), only a `PATH`, the job's
/// scratch directory as `TMPDIR`, the C locale, and a `GCONV_PATH` that
/// leads nowhere: the static ffmpeg's MPEG-TS demuxer converts DVB text
/// with its static glibc's iconv, which loads the system's gconv modules
/// and crashes in them (SIGSEGV, seen reading the package's own segments
/// for a storyboard); with none found it falls back to its own.
pub fn ffmpeg_env(scratch: &Path) -> Vec<(&'static str, std::ffi::OsString)> {
    vec![
        (
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
        ),
        ("TMPDIR", scratch.as_os_str().to_owned()),
        ("LANG", "C".into()),
        ("GCONV_PATH", "/nonexistent".into()),
    ]
}

/// Starts ffmpeg as every step runs it: in a cleared environment
/// ([`ffmpeg_env`]) with `scratch` as its working directory, `stdin` as
/// given, stdout and stderr piped, and killed if the returned child is
/// dropped (a handler that gives up on the job drops the future holding
/// it: ffmpeg must not outlive it).
pub fn spawn_ffmpeg(
    ffmpeg: &Path,
    args: &[String],
    scratch: &Path,
    stdin: Stdio,
) -> Result<tokio::process::Child, StepError> {
    tokio::process::Command::new(ffmpeg)
        .args(args)
        .env_clear()
        .envs(ffmpeg_env(scratch))
        .current_dir(scratch)
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            StepError::Failed(format!(
                "cannot run ffmpeg ({}): {e}; set {ENV_FFMPEG} or add the ffmpeg layer",
                ffmpeg.display()
            ))
        })
}

/// Why an ffmpeg run writing files did not finish well.
#[derive(Debug)]
pub enum RunFailure {
    /// It could not start, or be waited for: the worker's fault.
    Step(StepError),
    /// Stopped [`STOP_BEFORE_DEADLINE`] before the deadline, unfinished.
    OutOfTime,
    /// It exited with an error; its last error lines.
    Exited { status: ExitStatus, tail: String },
}

impl RunFailure {
    /// The job's error: retried whatever happened (ffmpeg's exit may be
    /// the worker's fault, and the caps poison what always fails), with
    /// `too_slow` suggested when it ran out of time and `done` (what it
    /// had done) when it failed.
    pub fn into_step_error(self, too_slow: &str, done: &str) -> StepError {
        match self {
            RunFailure::Step(err) => err,
            RunFailure::OutOfTime => StepError::Failed(format!(
                "ffmpeg stopped {} s before the invocation deadline, unfinished; the job is \
                 retried{too_slow}",
                STOP_BEFORE_DEADLINE.as_secs()
            )),
            RunFailure::Exited { status, tail } => {
                StepError::Failed(format!("ffmpeg failed ({status}){done}: {tail}"))
            }
        }
    }
}

/// Runs ffmpeg writing files in `scratch` to its end, each line it writes
/// on stdout handed to `on_line` (its `-progress` report, if asked for);
/// killed [`STOP_BEFORE_DEADLINE`] before `time_left` runs out.
pub async fn run_to_end(
    ffmpeg: &Path,
    args: &[String],
    scratch: &Path,
    time_left: Option<Duration>,
    mut on_line: impl FnMut(&str),
) -> Result<(), RunFailure> {
    let stop_at = time_left
        .map(|left| tokio::time::Instant::now() + left.saturating_sub(STOP_BEFORE_DEADLINE));
    let mut child = spawn_ffmpeg(ffmpeg, args, scratch, Stdio::null()).map_err(RunFailure::Step)?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    // ffmpeg's errors, kept for the job's error message.
    let errors = tokio::spawn(async move {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text).await;
        text
    });
    let lines = async {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            on_line(&line);
        }
    };
    let run = async { tokio::join!(lines, child.wait()).1 };
    let status = match stop_at {
        Some(stop_at) => tokio::time::timeout_at(stop_at, run).await.ok(),
        None => Some(run.await),
    };
    let Some(status) = status else {
        let _ = child.kill().await;
        return Err(RunFailure::OutOfTime);
    };
    let status = status
        .map_err(|e| RunFailure::Step(StepError::Failed(format!("waiting for ffmpeg: {e}"))))?;
    if !status.success() {
        let stderr = errors.await.unwrap_or_default();
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(RunFailure::Exited {
            status,
            tail: tail.join(" | "),
        });
    }
    Ok(())
}

/// Removes a job's scratch directory however the step ends.
pub(crate) struct ScratchDir(pub PathBuf);

impl ScratchDir {
    /// A new directory for one run of `job_key` in `scratch`
    /// ([`crate::step::scratch::unique_path`]; a crashed process's
    /// leftovers at the name are cleared first).
    pub(crate) fn create(scratch: &Path, job_key: &str) -> Result<Self, StepError> {
        let dir = crate::step::scratch::unique_path(scratch, &format!("mediaonce-{job_key}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| StepError::Failed(format!("creating {}: {e}", dir.display())))?;
        Ok(ScratchDir(dir))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A movie step's scratch directory: the upload spooled to `input`, its
/// `moov` read, removed when dropped.
pub(crate) struct MovieScratch {
    pub dir: PathBuf,
    pub input: PathBuf,
    pub movie: bmff::MovieInfo,
    _cleanup: ScratchDir,
}

impl MovieScratch {
    /// Makes the job's directory under `scratch` (named by the job: a
    /// crashed attempt's leftovers are replaced) once the input and
    /// `reserve` fit, spools the input there, and reads its `moov` as
    /// `step` does. A movie whose data lives outside the file is refused:
    /// ffmpeg would be asked to open it.
    pub async fn prepare(
        scratch: &Path,
        reserve: u64,
        context: &StepContext<'_>,
        step: &str,
    ) -> Result<Self, StepError> {
        let input = context.input;
        // An input the handler already holds in a scratch file is linked,
        // not copied: only the outputs need room then.
        let spooled = if input.is_in_file() {
            0
        } else {
            input.head.size
        };
        crate::step::scratch::ensure_room(scratch, spooled, reserve).map_err(StepError::Failed)?;
        let cleanup = ScratchDir::create(scratch, context.job_key)?;
        let dir = cleanup.0.clone();
        let input_path = dir.join("input");
        input.spool_to(&input_path).await?;
        let movie = read_movie_for(&input_path, step).await?;
        refuse_external_data(&movie, step)?;
        Ok(MovieScratch {
            dir,
            input: input_path,
            movie,
            _cleanup: cleanup,
        })
    }
}

/// Refuses, for good, a movie whose data lies outside the file (a `dref`
/// naming another file or a URL): ffmpeg is never handed it.
pub(crate) fn refuse_external_data(movie: &bmff::MovieInfo, step: &str) -> Result<(), StepError> {
    match movie.external_data() {
        Some(reference) => Err(StepError::Unprocessable(format!(
            "{step} refuses a movie whose data is outside the file ({reference}): \
             ffmpeg would be asked to open it"
        ))),
        None => Ok(()),
    }
}

/// The `moov` of a spooled MP4/MOV, as `step` reads it.
async fn read_movie_for(path: &Path, step: &str) -> Result<bmff::MovieInfo, StepError> {
    let unreadable = |e: bmff::BmffError| movie_error(e, &format!("{step} reads MP4/MOV inputs"));
    let file = std::fs::File::open(path)
        .map_err(|e| StepError::Failed(format!("opening {}: {e}", path.display())))?;
    let size = file
        .metadata()
        .map_err(|e| StepError::Failed(e.to_string()))?
        .len();
    bmff::read_movie(&file, size, &[]).await.map_err(unreadable)
}

/// How long ffmpeg may run in `context`'s invocation, read from the
/// worker's clock once.
pub fn time_left(context: &StepContext<'_>) -> Option<Duration> {
    context
        .deadline_ms
        .map(|deadline| Duration::from_millis(deadline.saturating_sub(context.clock.now_ms())))
}
