//! The execution's ends: the failure task finishes the job failed; the
//! end task releases the execution's holds on its chunks and hands every
//! version that references the job on.

use super::{claim_of, errors, own_row, Answer};
use crate::handler::job::execution::{chunk_keys, execution_holder};
use crate::handler::App;
use crate::key::Recipe;
use crate::ledger::FinishError;
use crate::pipeline::split::SplitTask;
use crate::pipeline::HandOn;
use crate::queue::{message_group, Outgoing};
use crate::store::ObjectRef;

/// The failure task: the job finished failed as the chunk's (or the
/// join's) error says: for good when the input is at fault or a chunk
/// spent its runs, else retryably (the versions handed on take it over
/// and start an execution of their own, a run counted).
pub(super) async fn fail(app: &App, task: &SplitTask) -> Result<Answer, String> {
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
pub(super) async fn end(app: &App, task: &SplitTask, package: &Recipe) -> Result<Answer, String> {
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
