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

use futures::{StreamExt, TryStreamExt};

use super::chunk::trusted_hash;
use super::job::execution::{chunk_keys, execution_holder};
use super::job::{finish, BatchJobs, JobRun};
use super::join::write_package;
use super::{App, Invocation, JobReport, MessageReport, Outcome, StartCheck};
use crate::config::RecipeRule;
use crate::executions::{executions_prefix, ExecutionClient, ExecutionErrorKind};
use crate::fingerprint::{Fingerprint, ObjectHead};
use crate::key::{job_key, Recipe};
use crate::ledger::{Claim, FinishError, JobRow, JobStatus};
use crate::pipeline::split::{
    Span, SplitTask, CHUNK_TASK, END_TASK, FAILED_TASK, JOIN_TASK,
};
use crate::pipeline::HandOn;
use crate::queue::{message_group, Outgoing};
use crate::step::StepError;
use crate::steps::hls::chunk_job::{ChunkParams, CHUNK_STEP};
use crate::store::ObjectRef;

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

/// Chunk rows read at once by a join.
const READS_AT_ONCE: usize = 16;

/// A task's answer: success, or an error name and a cause.
type Answer = Result<(), (&'static str, String)>;

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
        CHUNK_TASK => match run_chunk(app, batch, invocation, task, &package).await? {
            ChunkRun::Answer(report, answer) => (vec![report], answer),
            ChunkRun::ComesBack(report) => return Ok((vec![report], None)),
        },
        JOIN_TASK => (Vec::new(), join(app, task).await?),
        FAILED_TASK => (Vec::new(), fail(app, task).await?),
        END_TASK => (Vec::new(), end(app, task, &package).await?),
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

enum ChunkRun {
    /// The chunk ended for this task: its report and the answer.
    Answer(JobReport, Answer),
    /// Busy or deferred: the message comes back, the task waits.
    ComesBack(JobReport),
}

/// A chunk task: the span's chunk job, claimed and run like any job.
async fn run_chunk(
    app: &App,
    batch: &BatchJobs,
    invocation: &Invocation,
    task: &SplitTask,
    package: &Recipe,
) -> Result<ChunkRun, String> {
    let span = task.span.ok_or("a chunk task without its span")?;
    let rule = chunk_rule(app, &task.job.recipe_name, package, span)?;
    let Some((head, fingerprint)) = locate_input(app, task).await? else {
        let report = chunk_report(&rule, Outcome::Skipped, "no live version holds the input");
        let cause = format!(
            "chunk {} of {}: no version that references the job holds its bytes any more",
            span.index, task.job.key
        );
        return Ok(ChunkRun::Answer(report, Err((errors::INPUT_GONE, cause))));
    };
    let key = job_key(&fingerprint.input_hash, &rule.recipe_hash);
    let bytes = app.object_bytes(head, &[rule.step.input_use()]);
    let run = JobRun {
        app,
        invocation,
        rule: &rule,
        job_key: &key,
        bytes: &bytes,
        fingerprint: &fingerprint,
        // A chunk is never split again.
        queue_url: None,
    };
    let report = run.run_in(batch, &[]).await;
    let reason = report.reason.clone().unwrap_or_default();
    let cause = |what: &str| format!("chunk {} ({} ms on, job {key}) {what}: {reason}", span.index, span.start_ms);
    let answer = match report.outcome {
        Outcome::Ran | Outcome::Reused => Ok(()),
        Outcome::Busy | Outcome::Deferred => return Ok(ChunkRun::ComesBack(report)),
        Outcome::Unprocessable => Err((errors::UNPROCESSABLE, cause("cannot be processed"))),
        Outcome::Poisoned => Err((errors::POISONED, cause("spent its runs"))),
        _ => Err((errors::TRANSIENT, cause("failed"))),
    };
    // The message is done either way: the execution carries the chunk on
    // (a failure is retried by the definition, with a new message).
    let report = match answer {
        Ok(()) => report,
        Err(_) => JobReport {
            outcome: Outcome::Waiting,
            reason: Some(format!("{}: {reason}; its execution is told", report.outcome.as_str())),
            ..report
        },
    };
    Ok(ChunkRun::Answer(report, answer))
}

/// A version holding the job's input bytes, and their hash as S3 or
/// mediaonce computed it: the execution's own location while it holds
/// them, else any other version that references the job (the claimant's
/// upload may be gone while another upload of the bytes is not).
async fn locate_input(
    app: &App,
    task: &SplitTask,
) -> Result<Option<(ObjectHead, Fingerprint)>, String> {
    let wanted = &task.job.input_hash;
    for location in &task.job.locations {
        let object = ObjectRef {
            bucket: location.bucket.clone(),
            key: location.key.clone(),
            version_id: location.version_id.clone(),
            if_match: Some(location.etag.clone()),
        };
        if let Some(found) = holds(app, &object, wanted).await? {
            return Ok(Some(found));
        }
    }
    let holders = app
        .ledger
        .holders(&task.job.key)
        .await
        .map_err(|e| e.to_string())?;
    for version in holders.into_iter().filter_map(|holder| holder.version) {
        let object = ObjectRef {
            bucket: version.bucket,
            key: version.key,
            version_id: version.version_id,
            if_match: None,
        };
        if let Some(found) = holds(app, &object, wanted).await? {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

/// `object`'s head and hash when it exists and its trusted hash is
/// `wanted`.
async fn holds(
    app: &App,
    object: &ObjectRef,
    wanted: &str,
) -> Result<Option<(ObjectHead, Fingerprint)>, String> {
    let Some(head) = app.store.head(object).await.map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    if object
        .if_match
        .as_deref()
        .is_some_and(|etag| head.etag.trim_matches('"') != etag)
    {
        return Ok(None);
    }
    Ok(match trusted_hash(app, &head, wanted).await {
        Ok(fingerprint) if fingerprint.input_hash == wanted => Some((head, fingerprint)),
        // Other bytes, or bytes whose hash nobody computed: not these.
        _ => None,
    })
}

/// The chunk's recipe, from the package recipe as claimed, bound to the
/// `hls-chunk` step.
fn chunk_rule(app: &App, name: &str, package: &Recipe, span: Span) -> Result<RecipeRule, String> {
    let step = app
        .config
        .chunk_step
        .as_ref()
        .ok_or_else(|| format!("no {CHUNK_STEP} step is registered to run chunk tasks"))?;
    let recipe = ChunkParams::recipe(package, span.index, span.start_ms, span.end_ms);
    let step = step.bind(&recipe.params)?;
    Ok(RecipeRule {
        index: 0,
        name: format!("{name}#chunk-{}", span.index),
        input: None,
        named: true,
        recipe_hash: recipe.hash(),
        recipe,
        key_match: Default::default(),
        step,
    })
}

fn chunk_report(rule: &RecipeRule, outcome: Outcome, reason: &str) -> JobReport {
    JobReport {
        job_key: String::new(),
        recipe: rule.name.clone(),
        step: CHUNK_STEP.to_string(),
        version: rule.recipe.version,
        outcome,
        attempt: 0,
        duration_ms: 0,
        reason: Some(reason.to_string()),
        busy_until_ms: None,
        input_hash_source: None,
        outputs: None,
    }
}

/// The job's row while it is this execution's: running, its execution
/// this one.
async fn own_row(app: &App, task: &SplitTask) -> Result<Option<JobRow>, String> {
    let row = app.ledger.get(&task.job.key).await.map_err(|e| e.to_string())?;
    Ok(row.filter(|row| {
        row.status == JobStatus::Running && row.execution.as_deref() == Some(&task.execution)
    }))
}

/// The claim the execution finishes the job with: its claimant's.
fn claim_of(row: &JobRow) -> Claim {
    Claim {
        job_key: row.job_key.clone(),
        owner: row.owner.clone(),
        attempt: row.attempts,
        lease_until_ms: row.lease_until_ms,
        output_prefix: row.output_prefix.clone(),
        had_split: false,
        superseded: None,
    }
}

/// The join task: every chunk done, their segments copied into the
/// package, its playlists and manifest written, the job finished.
async fn join(app: &App, task: &SplitTask) -> Result<Answer, String> {
    let Some(row) = own_row(app, task).await? else {
        let row = app.ledger.get(&task.job.key).await.map_err(|e| e.to_string())?;
        if row.is_some_and(|row| row.status == JobStatus::Done) {
            return Ok(Ok(()));
        }
        let cause = format!("job {} is no longer this execution's", task.job.key);
        return Ok(Err((errors::SUPERSEDED, cause)));
    };
    let package = task.job.package_recipe()?;
    let keys = chunk_keys(&task.job.input_hash, &package, task.spans());
    let reads: Vec<_> = keys.iter().map(|key| app.ledger.get(key)).collect();
    let chunks: Vec<Option<JobRow>> = futures::stream::iter(reads)
        .buffered(READS_AT_ONCE)
        .try_collect()
        .await
        .map_err(|e| e.to_string())?;
    let mut done = Vec::with_capacity(chunks.len());
    for (index, (key, chunk)) in keys.iter().zip(&chunks).enumerate() {
        match chunk {
            Some(chunk) if chunk.status == JobStatus::Done => done.push(chunk),
            other => {
                let cause = format!(
                    "chunk {index} (job {key}) is {} at the join",
                    other.as_ref().map_or("gone", |c| c.status.as_str())
                );
                return Ok(Err((errors::TRANSIENT, cause)));
            }
        }
    }
    let claim = claim_of(&row);
    let written = write_package(app, &row, task.job.recipe.clone(), &done).await;
    let failure = match written {
        Ok(()) => None,
        // Retried by the definition; the row stays this execution's.
        Err(err) if !err.is_permanent() => {
            return Ok(Err((errors::TRANSIENT, format!("joining {}: {err}", row.job_key))))
        }
        Err(err) => Some(err),
    };
    let cause = failure.as_ref().map(StepError::to_string);
    match finish(&app.ledger, &claim, failure, app.now_ms()).await {
        Ok(()) => Ok(match cause {
            None => Ok(()),
            Some(cause) => Err((errors::UNPROCESSABLE, cause)),
        }),
        Err(FinishError::LostLease(_)) => Ok(Err((
            errors::SUPERSEDED,
            format!("job {} was taken over before its join finished", row.job_key),
        ))),
        Err(err) => Ok(Err((errors::TRANSIENT, err.to_string()))),
    }
}

/// The failure task: the job finished failed as the chunk's (or the
/// join's) error says: for good when the input is at fault or a chunk
/// spent its runs, else retryably (the versions handed on take it over
/// and start an execution of their own, a run counted).
async fn fail(app: &App, task: &SplitTask) -> Result<Answer, String> {
    let Some(row) = own_row(app, task).await? else {
        return Ok(Ok(()));
    };
    let failure = task.failure.clone().unwrap_or_default();
    let error = failure.error.as_deref().unwrap_or("States.Unknown");
    let cause = failure.cause.as_deref().unwrap_or("no cause given");
    let reason = format!("the split's execution failed: {error}: {cause}");
    let claim = claim_of(&row);
    let now = app.now_ms();
    let finished = match error {
        errors::UNPROCESSABLE => app.ledger.finish_permanent(&claim, &reason, now).await,
        errors::POISONED => {
            let cap = app.config.max_attempts;
            app.ledger.finish_spent(&claim, &reason, cap, now).await
        }
        _ => app.ledger.finish_failed(&claim, &reason, now).await,
    };
    match finished {
        Ok(()) | Err(FinishError::LostLease(_)) => Ok(Ok(())),
        Err(err) => Ok(Err((errors::TRANSIENT, err.to_string()))),
    }
}

/// The end task: the execution's holds on its chunks released, then every
/// version that references the job handed on (to the queue the
/// claimant's message came from): each walks its pipeline, finds the job
/// done (or failed), goes on downstream and publishes its event. A
/// version's reference is written before its claim reads the job, and
/// this read comes after the job's finish, so every version whose claim
/// found the job running is here; one whose claim came after the finish
/// reused it itself.
async fn end(app: &App, task: &SplitTask, package: &Recipe) -> Result<Answer, String> {
    let keys = chunk_keys(&task.job.input_hash, package, task.spans());
    app.ledger
        .release_held(&execution_holder(&task.execution), &keys, app.now_ms())
        .await
        .map_err(|e| format!("releasing the chunks: {e}"))?;
    let holders = app
        .ledger
        .holders(&task.job.key)
        .await
        .map_err(|e| e.to_string())?;
    let queue_url = &task.job.hand_on_queue_url;
    let mut handed_on = 0;
    for version in holders.into_iter().filter_map(|holder| holder.version) {
        let object = ObjectRef {
            bucket: version.bucket.clone(),
            key: version.key.clone(),
            version_id: version.version_id.clone(),
            if_match: None,
        };
        // A version gone meanwhile has no pipeline to walk.
        let Some(head) = app.store.head(&object).await.map_err(|e| e.to_string())? else {
            continue;
        };
        let body = HandOn::new(
            &head.bucket,
            &head.key,
            head.version_name(),
            head.etag.trim_matches('"'),
            head.size,
            vec![task.job.recipe_name.clone()],
            1,
        )
        .to_body();
        let group = message_group(&head.bucket, &head.key);
        let message = Outgoing {
            body: &body,
            group: &group,
            cause: &task.execution,
        };
        app.queue
            .send(queue_url, &message)
            .await
            .map_err(|e| format!("handing {object} on to {queue_url}: {e}"))?;
        handed_on += 1;
    }
    tracing::info!(job_key = task.job.key, execution = task.execution, handed_on, outcome = task.outcome.as_deref().unwrap_or(""), "split ended");
    Ok(Ok(()))
}
