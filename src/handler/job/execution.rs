//! A job that splits, run as a Step Functions execution (DESIGN.md,
//! "Chunked HLS"): the claimant records the execution on the job's row,
//! holds the chunks, and starts it ([`JobRun::start_execution`]); a
//! version whose claim finds the job's execution running is done: the
//! execution's end hands every version that references the job on
//! ([`JobRun::wait_for_execution`]). The tasks are
//! [`super::super::split`]'.

use std::time::Duration;

use super::super::{JobReport, Outcome};
use super::{JobRun, Reporter};
use crate::executions::{execution_arn, execution_name, ExecutionClient, ExecutionStatus};
use crate::fingerprint::FingerprintSource;
use crate::key::job_key;
use crate::ledger::{Claim, ClaimOutcome, Conditional, FinishError, JobRow, ExecutionRecord, Verdict};
use crate::pipeline::split::{ExecutionInput, Limits, Location, Span, SplitJob, MAX_SPANS};
use crate::step::ChunkSpan;
use crate::steps::hls::chunk_job::ChunkParams;

/// Every execution ends within the definition's `TimeoutSeconds` (two
/// days); the job's row is held that long and an hour more, so that no
/// claim takes a running execution's job over on its lease alone.
pub const EXECUTION_HOLD: Duration = Duration::from_secs(2 * 86_400 + 3_600);

/// The holder of an execution's references to its chunks: one per
/// execution, so that the end of one never frees what another holds.
pub fn execution_holder(execution_arn: &str) -> String {
    let name = execution_arn.rsplit(':').next().unwrap_or(execution_arn);
    format!("{}{name}", crate::references::HOLDER_PREFIX)
}

/// The chunk jobs of `package`'s job over `input_hash`, one per span.
pub fn chunk_keys(
    input_hash: &str,
    package: &crate::key::Recipe,
    spans: impl IntoIterator<Item = Span>,
) -> Vec<String> {
    spans
        .into_iter()
        .map(|span| {
            let recipe = ChunkParams::recipe(package, span.index, span.start_ms, span.end_ms);
            job_key(input_hash, &recipe.hash())
        })
        .collect()
}

impl JobRun<'_> {
    /// The claimed job split into `spans`, run as an execution of
    /// `machine`: recorded on the row, its chunks held, then started
    /// (the order the crash arguments in DESIGN.md rest on); `waiting`.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn start_execution(
        self,
        claim: &Claim,
        spans: &[ChunkSpan],
        queue_url: &str,
        (machine, executions): super::SplitEngine<'_>,
        report: &Reporter,
    ) -> JobReport {
        let app = self.app;
        if spans.len() > MAX_SPANS {
            let error = format!(
                "the input splits into {} chunks, more than one execution runs ({MAX_SPANS}): \
                 raise the recipe's chunk_seconds",
                spans.len()
            );
            let reason = match app.ledger.finish_permanent(claim, &error, app.now_ms()).await {
                Ok(()) | Err(FinishError::LostLease(_)) => error,
                Err(err) => format!("{error}; recording it failed: {err}"),
            };
            return report.of(Outcome::Unprocessable, claim.attempt, Some(reason));
        }
        let name = execution_name(self.job_key, &claim.owner);
        let arn = execution_arn(machine, &name);
        let spans: Vec<Span> = spans.iter().map(Span::from).collect();
        let chunks = chunk_keys(&self.fingerprint.input_hash, &self.rule.recipe, spans.clone());
        let head = &self.bytes.head;
        let input = ExecutionInput {
            job: SplitJob {
                key: self.job_key.to_string(),
                input_hash: self.fingerprint.input_hash.clone(),
                recipe_name: self.rule.name.clone(),
                recipe: self.rule.recipe.to_value(),
                output_prefix: claim.output_prefix.clone(),
                locations: vec![Location {
                    bucket: head.bucket.clone(),
                    key: head.key.clone(),
                    version_id: head.version_name().map(str::to_string),
                    etag: head.etag.trim_matches('"').to_string(),
                }],
                hand_on_queue_url: self.queue_url.unwrap_or(queue_url).to_string(),
            },
            queue_url: queue_url.to_string(),
            limits: Limits::standard(app.config.split_max_concurrency),
            spans,
        };
        let input = match serde_json::to_string(&input) {
            Ok(text) => text,
            Err(err) => return report.of(Outcome::Failed, claim.attempt, Some(err.to_string())),
        };
        let now = app.now_ms();
        let record = ExecutionRecord {
            owner: &claim.owner,
            execution: &arn,
            lease_until_ms: now.saturating_add(millis(EXECUTION_HOLD)),
        };
        let started = match app.ledger.record_execution(self.job_key, record, now).await {
            Ok(Conditional::Applied(())) => self.hold_and_start(claim, &chunks, &arn, &input, (machine, executions)).await,
            Ok(Conditional::Rejected(_)) => {
                let reason = "lease lost to another worker before splitting; its run stands";
                return report.of(Outcome::Busy, claim.attempt, Some(reason.into()));
            }
            Err(err) => Err(err.to_string()),
        };
        match started {
            Ok(()) => report.of(
                Outcome::Waiting,
                claim.attempt,
                Some(format!(
                    "split into {} chunk jobs run by execution {arn}; every version that uses \
                     the job is handed on when it ends",
                    chunks.len()
                )),
            ),
            Err(error) => {
                // Failed now, so that the message that comes back takes
                // the job over and starts an execution of its own.
                let reason = match app.ledger.finish_failed(claim, &error, app.now_ms()).await {
                    Ok(()) | Err(FinishError::LostLease(_)) => error,
                    Err(err) => format!("{error}; recording the failure failed too: {err}"),
                };
                report.of(Outcome::Failed, claim.attempt, Some(reason))
            }
        }
    }

    /// The chunks held by the execution (before it can run one, so that no
    /// sweep collects a chunk it needs), the holds of the attempt this one
    /// took over released, then the execution started. A start that fails
    /// releases the holds again: nothing will end it.
    async fn hold_and_start(
        self,
        claim: &Claim,
        chunks: &[String],
        arn: &str,
        input: &str,
        (machine, executions): (&str, &dyn ExecutionClient),
    ) -> Result<(), String> {
        let app = self.app;
        let holder = execution_holder(arn);
        app.ledger
            .hold(&holder, chunks, app.now_ms())
            .await
            .map_err(|e| format!("holding the chunks: {e}"))?;
        if let Some(old) = claim.superseded.as_deref().filter(|old| *old != arn) {
            app.ledger
                .release_held(&execution_holder(old), chunks, app.now_ms())
                .await
                .map_err(|e| format!("releasing the chunks of {old}: {e}"))?;
        }
        let name = arn.rsplit(':').next().unwrap_or(arn);
        match executions.start_execution(machine, name, input).await {
            Ok(_) => Ok(()),
            Err(err) => {
                let error = format!("starting the split's execution {arn}: {err}");
                let _ = app.ledger.release_held(&holder, chunks, app.now_ms()).await;
                Err(error)
            }
        }
    }

    /// A version whose claim found the job held by its split's execution:
    /// while the execution runs, its message is done (the execution's end
    /// hands every version that references the job on); an execution that
    /// closed without finishing the job (aborted, timed out) or never
    /// started (its claimant died between recording and starting it) is
    /// taken over, the run counted, and split anew.
    pub(super) async fn wait_for_execution(
        self,
        row: &JobRow,
        execution: &str,
        request: &crate::ledger::ClaimRequest,
        report: &Reporter,
    ) -> JobReport {
        let app = self.app;
        let Some((_, executions)) = app.split_engine() else {
            return report.settled(Verdict::Busy, row.clone());
        };
        let status = match executions.describe_execution(execution).await {
            Ok(status) => status,
            Err(err) => return report.of(Outcome::Failed, row.attempts, Some(err.to_string())),
        };
        match status {
            Some(ExecutionStatus::Running) => {
                // A chained job's version is an output, which no hand-on
                // walks: it comes back instead.
                if self.fingerprint.source == FingerprintSource::UpstreamManifest {
                    return report.settled(Verdict::Busy, row.clone());
                }
                report.of(
                    Outcome::Waiting,
                    row.attempts,
                    Some(format!(
                        "the job is split into chunk jobs by execution {execution}; the version \
                         is handed on when it ends"
                    )),
                )
            }
            _ => match app.ledger.take_over_closed(request, row).await {
                Ok(ClaimOutcome::Run(claim)) => self.run_claimed(&claim, report).await,
                Ok(ClaimOutcome::Done(row)) => report.settled(Verdict::Done, row),
                Ok(ClaimOutcome::Busy(row)) => report.settled(Verdict::Busy, row),
                Ok(ClaimOutcome::Poisoned(row)) => report.settled(Verdict::Poisoned, row),
                Err(err) => report.of(Outcome::Failed, row.attempts, Some(err.to_string())),
            },
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executions::{execution_arn, execution_name};

    /// Two claims of one job (a takeover) start two executions, each
    /// holding the chunks under a holder of its own: the end of the stale
    /// one releases its holds, never the newer one's.
    #[test]
    fn every_execution_holds_its_chunks_under_a_holder_of_its_own() {
        let machine = "arn:aws:states:us-east-1:1:stateMachine:split";
        let job = "a".repeat(64);
        let first = execution_arn(machine, &execution_name(&job, "claim/1"));
        let second = execution_arn(machine, &execution_name(&job, "claim/2"));
        assert_ne!(execution_holder(&first), execution_holder(&second));
        assert!(execution_holder(&first).starts_with(&format!("split#{job}-")));
    }
}
