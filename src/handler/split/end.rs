//! The execution's ends: the failure task finishes the job failed; the
//! end task releases the execution's holds on its chunks and hands every
//! version that references the job on.

use super::{claim_of, errors, own_row, Answer};
use crate::handler::job::execution::{chunk_keys, execution_holder};
use crate::handler::App;
use crate::key::Recipe;
use crate::ledger::FinishError;
use crate::handler::MessageReport;
use crate::pipeline::split::{ExecutionClosed, ExecutionInput, Span, SplitJob, SplitTask};
use crate::pipeline::HandOn;
use crate::queue::{message_group, Outgoing};
use crate::store::ObjectRef;

/// The failure task: the job finished failed as the chunk's (or the
/// join's) error says: for good when the input is at fault or a chunk
/// spent its runs, else retryably (the versions handed on take it over
/// and start an execution of their own, a run counted).
pub(super) async fn fail(app: &App, task: &SplitTask) -> Result<Answer, String> {
    let Some(row) = own_row(app, &task.job.key, &task.execution).await? else {
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

/// The end task: the execution's holds on its chunks released, then
/// every version that references the job handed on ([`end_attempt`]).
pub(super) async fn end(app: &App, task: &SplitTask, package: &Recipe) -> Result<Answer, String> {
    end_attempt(app, &task.execution, &task.job, &task.spans(), package).await?;
    tracing::info!(job_key = task.job.key, execution = task.execution, outcome = task.outcome.as_deref().unwrap_or(""), "split ended");
    Ok(Ok(()))
}

/// The end of an execution's attempt at the job, on every path that ends
/// one (its end task, and its status change when it closed without one):
/// its holds on the chunks released (each chunk marked for the sweep),
/// then every version that references the job handed on to the queue the
/// claimant's message came from. Each walks its pipeline, finds the job
/// done (or failed), goes on downstream and publishes its event. A
/// version's reference is written before its claim reads the job, and
/// this read comes after the job's finish, so every version whose claim
/// found the job running is here; one whose claim came after the finish
/// reused it itself.
async fn end_attempt(
    app: &App,
    execution: &str,
    job: &SplitJob,
    spans: &[Span],
    package: &Recipe,
) -> Result<(), String> {
    let keys = chunk_keys(&job.input_hash, package, spans.iter().copied());
    app.ledger
        .release_held(&execution_holder(execution), &keys, app.now_ms())
        .await
        .map_err(|e| format!("releasing the chunks: {e}"))?;
    let holders = app
        .ledger
        .holders(&job.key)
        .await
        .map_err(|e| e.to_string())?;
    let queue_url = &job.hand_on_queue_url;
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
        let hand_on = HandOn::new(
            &head.bucket,
            &head.key,
            head.version_name(),
            head.etag.trim_matches('"'),
            head.size,
            vec![job.recipe_name.clone()],
            1,
        );
        // The claimant's own upload: the execution ran the job for it.
        let started_it = job.locations.first().is_some_and(|first| {
            first.bucket == version.bucket
                && first.key == version.key
                && first.version_id == version.version_id
        });
        let body = match started_it {
            true => hand_on.that_ran(&job.key),
            false => hand_on,
        }
        .to_body();
        let group = message_group(&head.bucket, &head.key);
        let message = Outgoing {
            body: &body,
            group: &group,
            cause: execution,
        };
        app.queue
            .send(queue_url, &message)
            .await
            .map_err(|e| format!("handing {object} on to {queue_url}: {e}"))?;
    }
    Ok(())
}

/// A split's execution closed without succeeding (the template's
/// EventBridge rule on its status change): when the job is still this
/// execution's (no failure task finished it: the execution was aborted,
/// timed out, or its failure task itself failed), the job is finished
/// failed (retryable: the versions handed on take it over and start an
/// execution of their own, a run counted) and the attempt ended. An
/// event of another state machine, or of an execution whose job another
/// path finished, changes nothing.
pub(in crate::handler) async fn process_closed(
    app: &App,
    message_id: String,
    closed: &ExecutionClosed,
) -> MessageReport {
    let error = match closed_execution(app, closed).await {
        Ok(what) => {
            tracing::info!(message_id, execution = closed.execution_arn, status = closed.status, what, "split execution closed");
            None
        }
        Err(error) => {
            tracing::warn!(message_id, execution = closed.execution_arn, error, "ending a closed split execution failed: the message comes back");
            Some(error)
        }
    };
    MessageReport {
        message_id,
        jobs: Vec::new(),
        error,
    }
}

async fn closed_execution(app: &App, closed: &ExecutionClosed) -> Result<&'static str, String> {
    let Some((machine, _)) = app.split_engine() else {
        return Err("an execution status change, and no state machine is configured \
                    (MEDIAONCE_SPLIT_MACHINE_ARN)"
            .into());
    };
    if closed.state_machine_arn != machine {
        return Ok("another state machine's execution: nothing to do");
    }
    if matches!(closed.status.as_str(), "RUNNING" | "SUCCEEDED" | "PENDING_REDRIVE") {
        return Ok("not a closed failure: nothing to do");
    }
    let input: Option<ExecutionInput> = closed
        .input
        .as_deref()
        .and_then(|text| serde_json::from_str(text).ok());
    let job_key = match (&input, closed.job_key()) {
        (Some(input), _) => input.job.key.clone(),
        (None, Some(key)) => key.to_string(),
        (None, None) => return Ok("not a split's execution: nothing to do"),
    };
    let Some(row) = own_row(app, &job_key, &closed.execution_arn).await? else {
        return Ok("the job is not this execution's any more: nothing to do");
    };
    let reason = format!(
        "the split's execution {} ended {} without finishing the job",
        closed.execution_arn, closed.status
    );
    match app
        .ledger
        .finish_failed(&claim_of(&row), &reason, app.now_ms())
        .await
    {
        Ok(()) | Err(FinishError::LostLease(_)) => {}
        Err(err) => return Err(err.to_string()),
    }
    let Some(input) = input else {
        // EventBridge leaves out an input past 248 KiB; an execution's is
        // at most about 100 KB (MAX_SPANS), so this is a rule not ours.
        return Ok("the job finished failed; the event had no input to end the attempt with");
    };
    let package = input.job.package_recipe()?;
    end_attempt(app, &closed.execution_arn, &input.job, &input.spans, &package).await?;
    Ok("the job finished failed and the attempt ended")
}
