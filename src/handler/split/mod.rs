//! The tasks of a split's Step Functions execution (DESIGN.md, "Chunked
//! HLS"; `statemachine/hls-split.asl.json`): each is a message with its
//! task token, answered with SendTaskSuccess or SendTaskFailure.
//!
//! - *chunk*: one span run as a chunk job (content-keyed: a chunk done
//!   before answers at once), reading the bytes from any live version
//!   that holds them;
//! - *join*: every chunk's segments copied into the job's package, its
//!   playlists and manifest written, the job finished `done`;
//! - *failed*: the job finished failed, as the chunk's error says;
//! - *end*: the execution's holds on its chunks released, and every
//!   version that references the job handed on to walk its pipeline (and
//!   publish its event).
//!
//! Every task first heartbeats its token: a task that ended (answered,
//! timed out, its execution stopped) acknowledges its message with
//! nothing done. The job's row is changed only while it is this
//! execution's (`running`, its `split_execution` this one): a stale
//! execution's tasks change nothing.

use std::time::Duration;

use super::job::BatchJobs;
use super::{App, Invocation, JobReport, MessageReport, StartCheck};
use crate::executions::{executions_prefix, ExecutionClient, ExecutionErrorKind};
use crate::key::job_key;
use crate::ledger::{Claim, JobRow, JobStatus};
use crate::pipeline::split::{SplitTask, CHUNK_TASK, END_TASK, FAILED_TASK, JOIN_TASK};

mod chunk;
mod end;
mod join;

pub(super) use end::process_closed;

/// The error names the definition's `Retry` and `Catch` match on.
pub mod errors {
    /// A passing failure: retried soon.
    pub const TRANSIENT: &str = "mediaonce.Transient";
    /// The input is at fault: no retry can fix it.
    pub const UNPROCESSABLE: &str = "mediaonce.Unprocessable";
    /// A chunk spent its runs.
    pub const POISONED: &str = "mediaonce.Poisoned";
    /// No live version holds the input's bytes any more.
    pub const INPUT_GONE: &str = "mediaonce.InputGone";
    /// The job is no longer this execution's (taken over, or collected).
    pub const SUPERSEDED: &str = "mediaonce.Superseded";
}

/// The time a join or an end needs left to start, else its message comes
/// back for a fresher invocation (its heartbeat holds the task): a join
/// copies server-side, an hour's 60 chunks in seconds.
const TASK_MARGIN: Duration = Duration::from_secs(30);

/// A task's answer: success, or an error name and a cause.
pub(super) type Answer = Result<(), (&'static str, String)>;

/// Runs a task's message; its report, or why it must come back.
pub(super) async fn process_task(
    app: &App,
    batch: &BatchJobs,
    invocation: &Invocation,
    message_id: String,
    task: &SplitTask,
) -> MessageReport {
    let (jobs, error) = match run_task(app, batch, invocation, task).await {
        Ok((jobs, comes_back)) => (jobs, comes_back),
        Err(error) => (Vec::new(), Some(error)),
    };
    if let Some(error) = &error {
        tracing::warn!(message_id, kind = task.mediaonce, execution = task.execution, error, "split task comes back");
    } else {
        tracing::info!(message_id, kind = task.mediaonce, execution = task.execution, "split task done");
    }
    MessageReport {
        message_id,
        jobs,
        error,
    }
}

/// The task's job reports and, when its message must come back, why.
async fn run_task(
    app: &App,
    batch: &BatchJobs,
    invocation: &Invocation,
    task: &SplitTask,
) -> Result<(Vec<JobReport>, Option<String>), String> {
    let (machine, executions) = app.split_engine().ok_or_else(|| {
        format!(
            "a {} message, and no state machine is configured (MEDIAONCE_SPLIT_MACHINE_ARN)",
            task.mediaonce
        )
    })?;
    // Only our own state machine's executions: its input was written by a
    // claimant that checked the hash it keyed by.
    let ours = executions_prefix(machine).is_some_and(|p| task.execution.starts_with(&p));
    if !ours {
        return Err(format!(
            "a {} message of execution {}, not one of {machine}'s",
            task.mediaonce, task.execution
        ));
    }
    let package = task.job.package_recipe()?;
    if job_key(&task.job.input_hash, &package.hash()) != task.job.key {
        return Err(format!(
            "a {} message whose job {} is not the key of its input hash and recipe",
            task.mediaonce, task.job.key
        ));
    }
    match executions.send_task_heartbeat(&task.task_token).await {
        Ok(()) => {}
        Err(err) if err.kind == ExecutionErrorKind::TaskGone => {
            tracing::info!(execution = task.execution, kind = task.mediaonce, "the task ended already: nothing to do");
            return Ok((Vec::new(), None));
        }
        Err(err) => return Err(err.to_string()),
    }
    if task.mediaonce != CHUNK_TASK {
        if let StartCheck::Later(reason) | StartCheck::Never(reason) =
            app.start_check(invocation, TASK_MARGIN)
        {
            return Ok((Vec::new(), Some(reason)));
        }
    }
    let (jobs, answer) = match task.mediaonce.as_str() {
        CHUNK_TASK => match chunk::run_chunk(app, batch, invocation, task, &package).await? {
            chunk::ChunkRun::Answer(report, answer) => (vec![report], answer),
            chunk::ChunkRun::ComesBack(report) => return Ok((vec![report], None)),
        },
        JOIN_TASK => (Vec::new(), join::join(app, task).await?),
        FAILED_TASK => (Vec::new(), end::fail(app, task).await?),
        END_TASK => (Vec::new(), end::end(app, task, &package).await?),
        other => return Err(format!("a split task of unknown kind {other:?}")),
    };
    answer_task(executions, &task.task_token, answer).await?;
    Ok((jobs, None))
}

/// Sends the task's answer; one that finds the task ended is done.
async fn answer_task(
    executions: &dyn ExecutionClient,
    token: &str,
    answer: Answer,
) -> Result<(), String> {
    let sent = match &answer {
        Ok(()) => executions.send_task_success(token, "{}").await,
        Err((error, cause)) => {
            let cause = crate::ledger::truncate_chars(cause, 2_000);
            executions.send_task_failure(token, error, &cause).await
        }
    };
    match sent {
        Ok(()) => Ok(()),
        Err(err) if err.kind == ExecutionErrorKind::TaskGone => Ok(()),
        Err(err) => Err(err.to_string()),
    }
}

/// The job's row while it is this execution's: running, its execution
/// this one.
pub(super) async fn own_row(
    app: &App,
    job_key: &str,
    execution: &str,
) -> Result<Option<JobRow>, String> {
    let row = app.ledger.get(job_key).await.map_err(|e| e.to_string())?;
    Ok(row.filter(|row| is_own(row, execution)))
}

/// Whether `row` is `execution`'s: `running`, its `split_execution` that.
pub(super) fn is_own(row: &JobRow, execution: &str) -> bool {
    row.status == JobStatus::Running && row.execution.as_deref() == Some(execution)
}

/// The claim the execution finishes the job with: its claimant's.
pub(super) fn claim_of(row: &JobRow) -> Claim {
    Claim {
        job_key: row.job_key.clone(),
        owner: row.owner.clone(),
        attempt: row.attempts,
        lease_until_ms: row.lease_until_ms,
        output_prefix: row.output_prefix.clone(),
        superseded: None,
    }
}

