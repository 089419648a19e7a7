//! The chunks' side of a split job (DESIGN.md, "Chunked HLS"): after each
//! chunk's terminal outcome its worker reads the parent ([`settle_parent`]).
//! Every chunk done: it takes the row ([`SplitWrite::Join`]), copies the
//! segments in, writes the playlists and the manifest, and finishes the
//! job. A chunk poisoned: it fails the job naming it. Each chunk settles
//! after its own finish, so the last chunk to finish sees every chunk done
//! (consistent reads); a settle that fails brings its chunk's message
//! back, and the redelivery (reusing the chunk) settles again. A settle
//! that finds another worker joining is done: the joiner's message
//! carries the join. The job's end (read after its finish, so every
//! waiter added before it is there) is [`super::split_end`]'s; a settle
//! that finds the job ended with its split still on the row ends it again.

use futures::{StreamExt, TryStreamExt};

use super::collect::collect_now;
use super::job::finish;
use super::split_end::{end_split, settled};
use super::{App, Invocation};
use crate::config::{split_s3_location, RecipeRule};
use crate::lease::is_live;
use crate::ledger::{
    judge, poison_reason, Claim, Conditional, FinishError, JobRow, JobStatus, SplitWrite, Verdict,
};
use crate::step::{content_type, JobOutputs, Manifest, StepError};
use crate::steps::hls::chunk_job::{ChunkSegments, SEGMENTS_FILE};
use crate::steps::hls::join::{plan_join, ChunkOutputs};

/// Chunk rows, or chunk outputs, read at once by a settle or a join.
const READS_AT_ONCE: usize = 16;

/// After a chunk of `package`'s job `parent` ended (done or poisoned):
/// the parent joined, failed, or its end handed on, as its row says. `Ok`
/// with what was done; `Err` brings the chunk's message back.
pub(super) async fn settle_parent(
    app: &App,
    invocation: &Invocation,
    queue_url: Option<&str>,
    package: &RecipeRule,
    parent: &str,
) -> Result<&'static str, String> {
    let Some(row) = app.ledger.get(parent).await.map_err(|e| e.to_string())? else {
        // Collected: its collection handed its waiters on.
        return Ok("the parent is gone");
    };
    let Some(split) = &row.split else {
        return Ok("the parent is not split");
    };
    let now = app.now_ms();
    if settled(app, &row) {
        collect_now(app, &end_split(app, &row, queue_url).await?).await;
        return Ok("the parent's end handed on");
    }
    match row.status {
        // Not settled (a done or poisoned parent was ended above): a
        // retryable failure, whose own message comes back, takes it over
        // and splits it again.
        JobStatus::Done | JobStatus::Failed => Ok("the parent failed and is retried"),
        JobStatus::Collecting => Ok("the parent is being collected"),
        // The joiner took the row having read every chunk ended, this one
        // among them, and its own message carries any retry: a join that
        // fails or whose worker dies comes back with it, and is taken over
        // once its lease passes. This message has nothing left to do.
        JobStatus::Running if split.joining && is_live(row.lease_until_ms, now) => {
            Ok("another worker joins the parent")
        }
        JobStatus::Running => {
            // An hour's 60 chunk rows, read 16 at a time, in order.
            // (The futures made first: a stream's closure over borrowed
            // rows is not `Send` for every lifetime, as spawn needs.)
            let reads: Vec<_> = split.chunks.iter().map(|key| app.ledger.get(key)).collect();
            let chunks: Vec<Option<JobRow>> = futures::stream::iter(reads)
                .buffered(READS_AT_ONCE)
                .try_collect()
                .await
                .map_err(|e| e.to_string())?;
            let max = app.config.max_attempts;
            let poisoned = chunks.iter().enumerate().find_map(|(index, chunk)| {
                chunk
                    .as_ref()
                    .filter(|c| judge(c, now, max) == Verdict::Poisoned)
                    .map(|c| (index, c))
            });
            let done: Option<Vec<&JobRow>> = chunks
                .iter()
                .map(|c| c.as_ref().filter(|c| c.status == JobStatus::Done))
                .collect();
            let joined = Join {
                app,
                invocation,
                queue_url,
                package,
                parent: &row,
            };
            if let Some((index, chunk)) = poisoned {
                let reason = format!(
                    "chunk {index} (job {key}) failed for good: {}; to run it again, \
                     `mediaonce retry {key}` and then this job",
                    poison_reason(chunk),
                    key = chunk.job_key,
                );
                joined.fail(&reason, chunk.permanent).await
            } else if let Some(done) = done {
                joined.join(&done).await
            } else {
                Ok("chunks still running")
            }
        }
    }
}

/// A split job whose chunks all ended, taken by this worker.
struct Join<'a> {
    app: &'a App,
    invocation: &'a Invocation,
    queue_url: Option<&'a str>,
    package: &'a RecipeRule,
    /// The row as read, before this worker took it.
    parent: &'a JobRow,
}

impl Join<'_> {
    /// Takes the row from its coordinator (or a join whose lease passed):
    /// the claim to finish it with, or `None` when another worker did.
    async fn take(&self) -> Result<Option<Claim>, String> {
        let app = self.app;
        let now = app.now_ms();
        let claim = Claim {
            job_key: self.parent.job_key.clone(),
            owner: app.owner_token(&self.invocation.request_id),
            attempt: self.parent.attempts,
            lease_until_ms: app
                .config
                .lease
                .lease_until_ms(now, self.invocation.deadline_ms),
            output_prefix: self.parent.output_prefix.clone(),
            had_split: true,
            superseded: None,
        };
        let write = SplitWrite::Join {
            seen_owner: &self.parent.owner,
            owner: &claim.owner,
            lease_until_ms: claim.lease_until_ms,
        };
        match app.ledger.write_split(&claim.job_key, write, now).await {
            Ok(Conditional::Applied(())) => Ok(Some(claim)),
            Ok(Conditional::Rejected(_)) => Ok(None),
            Err(err) => Err(err.to_string()),
        }
    }

    /// Every chunk done: the package written and the job finished, then
    /// its end handed on.
    async fn join(&self, chunks: &[&JobRow]) -> Result<&'static str, String> {
        let Some(claim) = self.take().await? else {
            return Ok("another worker joins the parent");
        };
        let written = self.write_package(&claim, chunks).await;
        if let Err(err) = &written {
            if !err.is_permanent() {
                // The lease passes; this chunk's message comes back and
                // joins again.
                return Err(format!("joining {}: {err}", claim.job_key));
            }
        }
        self.finish(&claim, written.err()).await
    }

    /// A chunk failed for good: so does the job, naming it.
    /// The job fails for good: unprocessable when its chunk's input was
    /// (`permanent`), else poisoned by its spent count, not permanent, so
    /// its waiting versions' messages go to the dead-letter queue rather
    /// than being told their input is at fault.
    async fn fail(&self, reason: &str, permanent: bool) -> Result<&'static str, String> {
        let Some(claim) = self.take().await? else {
            return Ok("another worker ends the parent");
        };
        let app = self.app;
        let now = app.now_ms();
        let finished = if permanent {
            let error = StepError::Unprocessable(reason.to_string());
            finish(&app.ledger, &claim, Some(error), now).await
        } else {
            let cap = app.config.max_attempts;
            app.ledger.finish_spent(&claim, reason, cap, now).await
        };
        self.end(&claim, finished).await
    }

    /// The job finished as `error` says, then its end handed on.
    async fn finish(&self, claim: &Claim, error: Option<StepError>) -> Result<&'static str, String> {
        let app = self.app;
        self.end(claim, finish(&app.ledger, claim, error, app.now_ms()).await)
            .await
    }

    /// After the job's finish (`finished`), its end handed on: the row read
    /// again, so every waiter added before the finish is on it.
    async fn end(
        &self,
        claim: &Claim,
        finished: Result<(), FinishError>,
    ) -> Result<&'static str, String> {
        let app = self.app;
        match finished {
            Ok(()) => {}
            Err(FinishError::LostLease(_)) => return Ok("another worker took the parent over"),
            Err(err) => return Err(err.to_string()),
        }
        match app.ledger.get(&claim.job_key).await.map_err(|e| e.to_string())? {
            // Ended by this finish (or since: a sweep that kept it owns
            // it now); `End` is conditioned on the owner read.
            Some(row) if matches!(row.status, JobStatus::Done | JobStatus::Failed) => {
                collect_now(app, &end_split(app, &row, self.queue_url).await?).await;
            }
            _ => return Ok("the parent changed after its finish"),
        }
        Ok("the parent joined")
    }

    /// The chunks' segments copied into the job's prefix, its playlists
    /// and its manifest written.
    async fn write_package(&self, claim: &Claim, chunks: &[&JobRow]) -> Result<(), StepError> {
        debug_assert_eq!(claim.job_key, self.parent.job_key);
        write_package(self.app, self.parent, self.package.recipe.to_value(), chunks).await
    }
}


/// The chunks' segments copied into the job's prefix, its playlists
/// and its manifest written: what one run of the whole input writes.
pub(super) async fn write_package(
app: &App,
parent: &JobRow,
recipe: serde_json::Value,
chunks: &[&JobRow],
) -> Result<(), StepError> {
    let located = |row: &JobRow| {
        split_s3_location(&row.output_prefix)
            .map(|(b, p)| (b.to_string(), p.to_string()))
            .ok_or_else(|| {
                StepError::Failed(format!(
                    "job {}'s output_prefix {:?} is not an s3://bucket/prefix/ location",
                    row.job_key, row.output_prefix
                ))
            })
    };
    // Each chunk's manifest and summaries (two GETs), 16 chunks at a
    // time, in order.
    let reads: Vec<_> = chunks
        .iter()
        .map(|chunk| async move {
            let (bucket, prefix) = located(chunk)?;
            let missing = |what: &str| {
                StepError::Failed(format!("chunk {}'s {what} is missing", chunk.job_key))
            };
            let manifest: Manifest = app
                .manifest_under(&bucket, &prefix)
                .await
                .map_err(StepError::Failed)?
                .ok_or_else(|| missing("manifest"))?;
            let segments: ChunkSegments = app
                .json_object(&bucket, &format!("{prefix}{SEGMENTS_FILE}"), "a chunk's segments")
                .await
                .map_err(StepError::Failed)?
                .ok_or_else(|| missing(SEGMENTS_FILE))?;
            Ok::<_, StepError>(ChunkOutputs {
                bucket,
                prefix,
                manifest,
                segments,
            })
        })
        .collect();
    let read: Vec<ChunkOutputs> = futures::stream::iter(reads)
        .buffered(READS_AT_ONCE)
        .try_collect()
        .await?;
    let plan = plan_join(&read).map_err(StepError::Unprocessable)?;
    let (bucket, prefix) = located(parent)?;
    let mut outputs = JobOutputs::new(app.store.clone(), bucket, prefix);
    outputs.copy_in(plan.copies).await?;
    for (name, text) in plan.playlists {
        outputs
            .put_bytes(&name, content_type(&name), text.into_bytes())
            .await?;
    }
    let manifest = Manifest {
        job_key: parent.job_key.clone(),
        input_hash: parent.input_hash.clone(),
        recipe,
        outputs: outputs.files(),
    };
    outputs.write_manifest(&manifest).await
}
