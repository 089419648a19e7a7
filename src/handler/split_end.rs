//! The end of a split job (DESIGN.md, "Chunked HLS"): its waiting
//! versions handed on and its chunks released (their `split#` items
//! deleted, each chunk marked for the sweep), then the split removed from
//! its row. Below both the job that splits and the chunks that join it,
//! and the collection that takes an abandoned one.

use super::App;
use crate::ledger::{judge, JobRow, JobStatus, SplitWrite, Verdict};
use crate::pipeline::HandOn;
use crate::queue::{message_group, Outgoing};

/// The holder of a split job's references to its chunks.
pub fn holder_of(parent: &str) -> String {
    format!("split#{parent}")
}

/// An ended split job's waiters handed on and its chunks released, then
/// the split removed from its row (conditioned on the row as read): the
/// chunks released, for the caller to collect at once when there is no
/// grace ([`super::collect::collect_now`]). Each step may be done again:
/// a release of what is released, a second hand-on (its jobs are reused),
/// a removal refused.
pub(super) async fn end_split(
    app: &App,
    row: &JobRow,
    queue_url: Option<&str>,
) -> Result<Vec<String>, String> {
    let Some(split) = &row.split else {
        return Ok(Vec::new());
    };
    release_split(app, row, queue_url).await?;
    let write = SplitWrite::End {
        seen_owner: &row.owner,
    };
    app.ledger
        .write_split(&row.job_key, write, app.now_ms())
        .await
        .map_err(|e| e.to_string())?;
    Ok(split.chunks.clone())
}

/// A split job's waiters handed on (to `queue_url`, else the queue its
/// chunks went to), then its chunks released: at its end, when it is
/// collected (a split whose lease passed: its waiters walk their pipelines
/// again and split it anew), and when a run after it releases its claim.
pub(super) async fn release_split(
    app: &App,
    row: &JobRow,
    queue_url: Option<&str>,
) -> Result<(), String> {
    let Some(split) = &row.split else {
        return Ok(());
    };
    if !split.waiters.is_empty() {
        let queue_url = queue_url
            .or(Some(split.queue_url.as_str()).filter(|url| !url.is_empty()))
            .ok_or_else(|| {
                format!(
                    "{} versions wait for job {}, and there is no queue to hand them on to",
                    split.waiters.len(),
                    row.job_key
                )
            })?;
        for waiter in &split.waiters {
            // A waiter is a hand-on message: its object is its group.
            let group = serde_json::from_str(waiter)
                .ok()
                .and_then(|body| HandOn::from_value(body).ok())
                .map_or_else(|| message_group(&row.job_key, ""), |w| message_group(&w.bucket, &w.key));
            app.queue
                .send(
                    queue_url,
                    &Outgoing {
                        body: waiter,
                        group: &group,
                        cause: &row.owner,
                    },
                )
                .await
                .map_err(|e| format!("handing a waiting version on to {queue_url}: {e}"))?;
        }
    }
    app.ledger
        .release_held(&holder_of(&row.job_key), &split.chunks, app.now_ms())
        .await
        .map_err(|e| format!("releasing {}'s chunks: {e}", row.job_key))
}

/// [`end_split`] of the job's row as it is now, when it has ended (done
/// or failed) with its split on it.
pub(super) async fn end_split_of(
    app: &App,
    job_key: &str,
    queue_url: Option<&str>,
) -> Result<Vec<String>, String> {
    match app.ledger.get(job_key).await.map_err(|e| e.to_string())? {
        Some(row) if matches!(row.status, JobStatus::Done | JobStatus::Failed) => {
            end_split(app, &row, queue_url).await
        }
        _ => Ok(Vec::new()),
    }
}

/// The job's split ended when no chunk will settle it: the job is done
/// (run whole after its split's lease passed) or failed for good. The
/// chunks released, as [`end_split`]'s.
pub(super) async fn end_if_settled(
    app: &App,
    job_key: &str,
    queue_url: Option<&str>,
) -> Result<Vec<String>, String> {
    let Some(row) = app.ledger.get(job_key).await.map_err(|e| e.to_string())? else {
        return Ok(Vec::new());
    };
    if settled(app, &row) {
        return end_split(app, &row, queue_url).await;
    }
    Ok(Vec::new())
}

/// Whether the split job has ended so that no chunk will change it: done,
/// or failed for good (a retryable failure is taken over and split anew).
pub(super) fn settled(app: &App, row: &JobRow) -> bool {
    let poisoned = judge(row, app.now_ms(), app.config.max_attempts) == Verdict::Poisoned;
    row.split.is_some() && (row.status == JobStatus::Done || poisoned)
}
