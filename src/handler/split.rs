//! A split job (DESIGN.md, "Chunked HLS"): a job whose step cuts its input
//! into chunks, each a job of its own handed on through the queue, joined
//! into the job's outputs when the last is done.
//!
//! - *Coordinate*: the claim's run records the chunk keys and its version
//!   as the first waiter on the row, with a lease for the whole split
//!   ([`SPLIT_LEASE`]); references every chunk (`split#<key>` items: no
//!   collection takes a chunk while the split lasts); sends one chunk
//!   message per chunk; and reports `waiting`: its message is done.
//! - *Wait*: a version whose claim finds the job split adds itself to the
//!   waiters (conditioned on the row still `running`) and reports `waiting`.
//! - *Settle*: after each chunk's terminal outcome its worker reads the
//!   parent. Every chunk done: it takes the row ([`SplitWrite::Join`]),
//!   copies the segments in, writes the playlists and the manifest, and
//!   finishes the job. A chunk poisoned: it fails the job naming it. Each
//!   chunk settles after its own finish, so the last chunk to finish sees
//!   every chunk done (consistent reads); a settle that fails brings its
//!   chunk's message back, and the redelivery (reusing the chunk) settles
//!   again.
//! - *End*: read after the job's finish, so every waiter added before it
//!   is there: the chunks released (marked, then their items deleted),
//!   every waiter handed on (its pipeline walked again: the job reused and
//!   the completion event published), then the split removed from the row.
//!   A settle that finds the job ended with its split still on the row
//!   ends it again.

use std::time::Duration;

use super::job::{finish, JobRun, Reporter};
use super::{App, Invocation, JobReport, Outcome};
use crate::config::{split_s3_location, RecipeRule};
use crate::key::job_key;
use crate::lease::is_live;
use crate::ledger::{
    judge, poison_reason, Claim, Conditional, FinishError, JobRow, JobStatus, SplitWrite, Verdict,
    MAX_SPLIT_BYTES,
};
use crate::pipeline::message::{ChunkHandOn, CHUNK_KIND};
use crate::pipeline::HandOn;
use crate::step::{content_type, ChunkSpan, JobOutputs, Manifest, StepError};
use crate::steps::hls::chunk_job::{ChunkParams, ChunkSegments, SEGMENTS_FILE};
use crate::steps::hls::join::{plan_join, ChunkOutputs};

/// How long a split job's coordinator holds it while its chunks run: a
/// split not joined by then is taken over by the next claim (a waiter's
/// redelivered or handed-on message), which sends the chunks not done
/// again.
pub const SPLIT_LEASE: Duration = Duration::from_secs(3600);

/// The holder of a split job's references to its chunks.
pub fn holder_of(parent: &str) -> String {
    format!("split#{parent}")
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl JobRun<'_> {
    /// The claimed job split into `spans`: recorded, its chunks referenced
    /// and sent to `queue_url`; `waiting`.
    pub(super) async fn coordinate(
        self,
        claim: &Claim,
        spans: &[ChunkSpan],
        queue_url: &str,
        report: &Reporter,
    ) -> JobReport {
        let app = self.app;
        let chunks: Vec<String> = spans
            .iter()
            .map(|span| {
                let recipe =
                    ChunkParams::recipe(&self.rule.recipe, span.index, span.start_ms, span.end_ms);
                job_key(&self.fingerprint.input_hash, &recipe.hash())
            })
            .collect();
        let now = app.now_ms();
        let waiter = self.waiter();
        let write = SplitWrite::Coordinate {
            owner: &claim.owner,
            chunks: &chunks,
            lease_until_ms: now.saturating_add(millis(SPLIT_LEASE)),
            waiter: &waiter,
            queue_url,
        };
        let sent = match app.ledger.write_split(self.job_key, write, now).await {
            Ok(Conditional::Applied(())) => {
                self.send_chunks(claim, spans, &chunks, queue_url).await
            }
            Ok(Conditional::Rejected(_)) => {
                let reason = "lease lost to another worker before splitting; its run stands";
                return report.of(Outcome::Busy, claim.attempt, Some(reason.into()));
            }
            Err(err) => Err(err.to_string()),
        };
        let error = match sent {
            Ok(()) => {
                let reason = format!(
                    "split into {} chunk jobs sent to {queue_url}; the version is handed on \
                     when they are joined",
                    chunks.len()
                );
                return report.of(Outcome::Waiting, claim.attempt, Some(reason));
            }
            Err(err) => format!("splitting into {} chunks: {err}", chunks.len()),
        };
        // Not held for the split's lease with chunks unsent: failed now, so
        // the message that comes back takes the job over and sends them.
        // Poisoned by it, the job's waiters are handed on now: no chunk
        // will settle it.
        let reason = match app.ledger.finish_failed(claim, &error, app.now_ms()).await {
            Ok(()) => match end_if_settled(app, self.job_key, Some(queue_url)).await {
                Ok(()) => error,
                Err(err) => format!("{error}; ending the split failed too: {err}"),
            },
            Err(FinishError::LostLease(_)) => error,
            Err(err) => format!("{error}; recording the failure failed too: {err}"),
        };
        report.of(Outcome::Failed, claim.attempt, Some(reason))
    }

    /// The chunks referenced by the split, then their messages sent: every
    /// chunk's, or, taking over a split whose lease passed, those of the
    /// chunks not done (at least one, whose settle joins them).
    async fn send_chunks(
        self,
        claim: &Claim,
        spans: &[ChunkSpan],
        chunks: &[String],
        queue_url: &str,
    ) -> Result<(), String> {
        let app = self.app;
        app.ledger
            .hold(&holder_of(self.job_key), chunks, app.now_ms())
            .await
            .map_err(|e| format!("referencing the chunks: {e}"))?;
        let mut unsent: Vec<&ChunkSpan> = Vec::with_capacity(spans.len());
        for (span, key) in spans.iter().zip(chunks) {
            let done = claim.had_split
                && app
                    .ledger
                    .get(key)
                    .await
                    .map_err(|e| e.to_string())?
                    .is_some_and(|row| row.status == JobStatus::Done);
            if !done {
                unsent.push(span);
            }
        }
        if unsent.is_empty() {
            unsent.extend(spans.last());
        }
        for span in unsent {
            let body = self.chunk_message(span).to_body();
            app.queue.send(queue_url, &body).await.map_err(|e| {
                format!("sending chunk {}'s message to {queue_url}: {e}", span.index)
            })?;
        }
        Ok(())
    }

    /// A version whose claim found the job split: it waits (its message
    /// is done; the job's end hands it on), or, when the split ended
    /// meanwhile or has too many waiters, is busy.
    pub(super) async fn wait_for_split(self, row: &JobRow, report: &Reporter) -> JobReport {
        let app = self.app;
        let waiter = self.waiter();
        let busy = |reason: String| JobReport {
            busy_until_ms: Some(app.now_ms()),
            ..report.of(Outcome::Busy, row.attempts, Some(reason))
        };
        let waiting = report.of(
            Outcome::Waiting,
            row.attempts,
            Some("the job is split into chunk jobs; the version is handed on when they are joined".into()),
        );
        let Some(split) = &row.split else {
            return busy("the job's split ended".into());
        };
        if split.waiters.contains(&waiter) {
            return waiting;
        }
        if split.bytes_with(&waiter) > MAX_SPLIT_BYTES {
            return JobReport {
                busy_until_ms: Some(row.lease_until_ms),
                ..report.of(
                    Outcome::Busy,
                    row.attempts,
                    Some(format!(
                        "the split job has {} waiting versions already (its row holds no more)",
                        split.waiters.len()
                    )),
                )
            };
        }
        let write = SplitWrite::Wait { waiter: &waiter };
        match app.ledger.write_split(self.job_key, write, app.now_ms()).await {
            Ok(Conditional::Applied(())) => waiting,
            Ok(Conditional::Rejected(_)) => busy("the job's split ended meanwhile".into()),
            Err(err) => report.of(Outcome::Failed, row.attempts, Some(err.to_string())),
        }
    }

    /// This version, as the hand-on message its wait ends with.
    fn waiter(self) -> String {
        let head = &self.bytes.head;
        HandOn::new(
            &head.bucket,
            &head.key,
            head.version_name(),
            head.etag.trim_matches('"'),
            head.size,
            vec![self.rule.name.clone()],
        )
        .to_body()
    }

    /// The message that runs `span` of this job's input.
    fn chunk_message(self, span: &ChunkSpan) -> ChunkHandOn {
        let head = &self.bytes.head;
        ChunkHandOn {
            mediaonce: CHUNK_KIND.to_string(),
            bucket: head.bucket.clone(),
            key: head.key.clone(),
            version_id: head.version_name().map(str::to_string),
            etag: head.etag.trim_matches('"').to_string(),
            size: head.size,
            recipe: self.rule.name.clone(),
            input_hash: self.fingerprint.input_hash.clone(),
            parent: self.job_key.to_string(),
            index: span.index,
            start_ms: span.start_ms,
            end_ms: span.end_ms,
        }
    }
}

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
    let poisoned = judge(&row, now, app.config.max_attempts) == Verdict::Poisoned;
    match row.status {
        JobStatus::Done => {
            end_split(app, &row, queue_url).await?;
            Ok("the parent's end handed on")
        }
        JobStatus::Failed if poisoned => {
            end_split(app, &row, queue_url).await?;
            Ok("the parent's failure handed on")
        }
        // Its own message comes back, takes it over and splits it again.
        JobStatus::Failed => Ok("the parent failed and is retried"),
        JobStatus::Collecting => Ok("the parent is being collected"),
        // Back when the join is done (or, if its worker died, to take it).
        JobStatus::Running if split.joining && is_live(row.lease_until_ms, now) => Err(format!(
            "another worker joins {parent} until {} ms: the message comes back",
            row.lease_until_ms
        )),
        JobStatus::Running => {
            let mut chunks = Vec::with_capacity(split.chunks.len());
            for key in &split.chunks {
                chunks.push(app.ledger.get(key).await.map_err(|e| e.to_string())?);
            }
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
                joined.fail(&reason).await
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
    async fn fail(&self, reason: &str) -> Result<&'static str, String> {
        let Some(claim) = self.take().await? else {
            return Ok("another worker ends the parent");
        };
        self.finish(&claim, Some(StepError::Unprocessable(reason.to_string())))
            .await
    }

    /// The job finished as `error` says, then (read again: every waiter
    /// added before the finish is on it) its end handed on.
    async fn finish(&self, claim: &Claim, error: Option<StepError>) -> Result<&'static str, String> {
        let app = self.app;
        match finish(&app.ledger, claim, error, app.now_ms()).await {
            Ok(()) => {}
            Err(FinishError::LostLease(_)) => return Ok("another worker took the parent over"),
            Err(err) => return Err(err.to_string()),
        }
        match app.ledger.get(&claim.job_key).await.map_err(|e| e.to_string())? {
            Some(row) if row.owner == claim.owner => end_split(app, &row, self.queue_url).await?,
            _ => return Ok("the parent changed after its finish"),
        }
        Ok("the parent joined")
    }

    /// The chunks' segments copied into the job's prefix, its playlists
    /// and its manifest written: what one run of the whole input writes.
    async fn write_package(&self, claim: &Claim, chunks: &[&JobRow]) -> Result<(), StepError> {
        let app = self.app;
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
        let mut read = Vec::with_capacity(chunks.len());
        for chunk in chunks {
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
            read.push(ChunkOutputs {
                bucket,
                prefix,
                manifest,
                segments,
            });
        }
        let plan = plan_join(&read).map_err(StepError::Unprocessable)?;
        let (bucket, prefix) = located(self.parent)?;
        let mut outputs = JobOutputs::new(app.store.clone(), bucket, prefix);
        outputs.copy_in(plan.copies).await?;
        for (name, text) in plan.playlists {
            outputs
                .put_bytes(&name, content_type(&name), text.into_bytes())
                .await?;
        }
        let manifest = Manifest {
            job_key: claim.job_key.clone(),
            input_hash: self.parent.input_hash.clone(),
            recipe: self.package.recipe.to_value(),
            outputs: outputs.files(),
        };
        outputs.write_manifest(&manifest).await
    }
}

/// An ended split job's waiters handed on and its chunks released (and,
/// with no grace, collected), then the split removed from its row
/// (conditioned on the row as read). Each step may be done again: a
/// release of what is released, a second hand-on (its jobs are reused), a
/// removal refused.
pub(super) async fn end_split(
    app: &App,
    row: &JobRow,
    queue_url: Option<&str>,
) -> Result<(), String> {
    let Some(split) = &row.split else {
        return Ok(());
    };
    release_split(app, row, queue_url).await?;
    super::record::collect_now(app, &split.chunks).await;
    let write = SplitWrite::End {
        seen_owner: &row.owner,
    };
    app.ledger
        .write_split(&row.job_key, write, app.now_ms())
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
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
            app.queue
                .send(queue_url, waiter)
                .await
                .map_err(|e| format!("handing a waiting version on to {queue_url}: {e}"))?;
        }
    }
    app.ledger
        .release_held(&holder_of(&row.job_key), &split.chunks, app.now_ms())
        .await
        .map_err(|e| format!("releasing {}'s chunks: {e}", row.job_key))
}

/// [`release_split`] of the job's row as it is now.
pub(super) async fn release_split_of(
    app: &App,
    job_key: &str,
    queue_url: Option<&str>,
) -> Result<(), String> {
    match app.ledger.get(job_key).await.map_err(|e| e.to_string())? {
        Some(row) => release_split(app, &row, queue_url).await,
        None => Ok(()),
    }
}

/// The job's split ended when no chunk will settle it: the job is done
/// (run whole after its split's lease passed) or failed for good.
pub(super) async fn end_if_settled(
    app: &App,
    job_key: &str,
    queue_url: Option<&str>,
) -> Result<(), String> {
    let Some(row) = app.ledger.get(job_key).await.map_err(|e| e.to_string())? else {
        return Ok(());
    };
    let poisoned = judge(&row, app.now_ms(), app.config.max_attempts) == Verdict::Poisoned;
    if row.split.is_some() && (row.status == JobStatus::Done || poisoned) {
        end_split(app, &row, queue_url).await?;
    }
    Ok(())
}
