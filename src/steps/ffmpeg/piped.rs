//! ffmpeg on pipes: its input on stdin, a known amount of output read
//! from stdout (HEIC and AVIF tiles in, AVIF out for `thumbnail`; a
//! package's keyframes in, storyboard tiles out), started as hls-package
//! starts it ([`super::spawn_ffmpeg`]: a cleared environment, killed with
//! its job), stopped before the invocation's deadline.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{spawn_ffmpeg, STOP_BEFORE_DEADLINE};
use crate::step::StepError;

/// Why a run gave nothing usable.
pub enum Failure {
    /// ffmpeg ran and refused the input or gave too little: the input's
    /// fault (the caller says which input).
    Output(String),
    /// ffmpeg could not run or finish in time: the worker's fault, retried.
    Step(StepError),
}

/// Runs `ffmpeg args` in `dir` with `input` on its stdin and returns
/// exactly `expected` bytes of its stdout (0: whatever it wrote to files
/// in `dir`). An error exit, or another amount of output, is a
/// [`Failure::Output`] naming ffmpeg's last lines.
pub async fn run(
    ffmpeg: &Path,
    args: &[String],
    dir: &Path,
    input: Vec<u8>,
    expected: usize,
    time_left: Option<Duration>,
) -> Result<Vec<u8>, Failure> {
    let mut child = spawn_ffmpeg(ffmpeg, args, dir, Stdio::piped()).map_err(Failure::Step)?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let write = async move {
        // ffmpeg may stop reading early (a bad stream): its exit says why.
        let _ = stdin.write_all(&input).await;
        drop(stdin);
    };
    let read = async move {
        let mut out = Vec::with_capacity(expected);
        // One byte more than expected shows output that should not be.
        let _ = stdout.take(expected as u64 + 1).read_to_end(&mut out).await;
        out
    };
    let errors = async move {
        let mut text = String::new();
        let _ = (&mut stderr)
            .take(64 * 1024)
            .read_to_string(&mut text)
            .await;
        text
    };
    let all = async { tokio::join!(write, read, errors, child.wait()) };
    let limit = time_left.map(|left| left.saturating_sub(STOP_BEFORE_DEADLINE));
    let outcome = match limit {
        Some(limit) => tokio::time::timeout(limit, all).await.ok(),
        None => Some(all.await),
    };
    let Some(((), output, errors, status)) = outcome else {
        return Err(Failure::Step(StepError::Failed(format!(
            "ffmpeg was stopped {} s before the invocation deadline, unfinished; the job is \
             retried",
            STOP_BEFORE_DEADLINE.as_secs()
        ))));
    };
    let status =
        status.map_err(|e| Failure::Step(StepError::Failed(format!("waiting for ffmpeg: {e}"))))?;
    // Killed by a signal (out of memory, the sandbox ending): not the
    // input's fault, retried; an input ffmpeg refuses exits with a code.
    if status.code().is_none() {
        return Err(Failure::Step(StepError::Failed(format!(
            "ffmpeg was killed ({status}); the job is retried"
        ))));
    }
    if !status.success() || output.len() != expected {
        let lines: Vec<&str> = errors.lines().rev().take(3).collect();
        let tail = lines.into_iter().rev().collect::<Vec<_>>().join(" | ");
        return Err(Failure::Output(format!(
            "ffmpeg gave {} of the {expected} bytes expected ({status}){}",
            output.len(),
            if tail.is_empty() {
                String::new()
            } else {
                format!(": {tail}")
            }
        )));
    }
    Ok(output)
}
