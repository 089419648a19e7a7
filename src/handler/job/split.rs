//! A job that splits (DESIGN.md, "Chunked HLS"): the claim's run records
//! the chunks and its version as the first waiter, references the chunks
//! and sends their messages ([`JobRun::coordinate`]); a version whose claim
//! finds the job split waits for it ([`JobRun::wait_for_split`]). The
//! chunks' side (settle, join) is [`super::super::join`]'s; the end,
//! [`super::super::split_end`]'s.

use std::time::Duration;

use super::super::split_end::{end_if_settled, holder_of};
use super::super::{collect::collect_now, JobReport, Outcome};
use super::{JobRun, Reporter};
use crate::fingerprint::FingerprintSource;
use crate::key::job_key;
use crate::ledger::{
    Claim, Conditional, FinishError, JobRow, JobStatus, SplitWrite, MAX_SPLIT_BYTES,
};
use crate::pipeline::message::{ChunkHandOn, CHUNK_KIND};
use crate::pipeline::HandOn;
use crate::queue::{message_group, Outgoing};
use crate::step::ChunkSpan;
use crate::steps::hls::chunk_job::ChunkParams;

/// How long a split job's coordinator holds it while its chunks run: a
/// split not joined by then is taken over by the next claim (a new upload
/// of the bytes, a reprocess), which sends the chunks not done again. Two
/// hours: longer than the template's chunk queue keeps a message in
/// flight (5,400 s), so a chunk whose worker died comes back inside it.
pub const SPLIT_LEASE: Duration = Duration::from_secs(7200);

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
                Ok(released) => {
                    collect_now(app, &released).await;
                    error
                }
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
            // Each chunk a group of its own on a FIFO queue: their order
            // does not matter, and one group would run them one at a time.
            let group = message_group(self.job_key, &span.index.to_string());
            let message = Outgoing {
                body: &body,
                group: &group,
                cause: &claim.owner,
            };
            app.queue.send(queue_url, &message).await.map_err(|e| {
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
        // Only a split still running takes waiters: a job being collected
        // (or ended) would acknowledge a version nobody hands on.
        if row.status != JobStatus::Running {
            return busy(format!("the split job is {}", row.status.as_str()));
        }
        // A chained job's version is an output, which no hand-on walks.
        if self.fingerprint.source == FingerprintSource::UpstreamManifest {
            return busy("a chained job waits for the split job by coming back".into());
        }
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
            1,
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
