//! One job: claim → step → manifest → finish, with the claim released
//! when its input changed under it.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::FutureExt;
use tokio::sync::OnceCell;

use super::{lock, App, Invocation, JobReport, Outcome, StartCheck};

pub(super) mod execution;

use crate::config::{split_s3_location, RecipeRule};
use crate::fingerprint::{Fingerprint, FingerprintSource};
use crate::ledger::{
    judge, poison_reason, Claim, ClaimOutcome, ClaimRequest, FinishError, JobRow, Ledger,
    Verdict,
};
use crate::step::{
    ChunkSpan, JobInput, JobOutputs, Manifest, ObjectBytes, StepContext, StepError,
};

/// Jobs seen in this batch, so that one key is claimed once, and input
/// hashes found, so that one object version is hashed once (a duplicated
/// notification in the same batch reads nothing).
#[derive(Default)]
pub(super) struct BatchJobs {
    jobs: Mutex<HashMap<String, Arc<OnceCell<JobReport>>>>,
    input_hashes: Mutex<HashMap<String, Arc<OnceCell<Fingerprint>>>>,
    versions: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl BatchJobs {
    pub fn cell(&self, key: &str) -> Arc<OnceCell<JobReport>> {
        lock(&self.jobs).entry(key.to_string()).or_default().clone()
    }

    /// The input hash of an object version (by its hash cache row key),
    /// once found by a record of this batch.
    pub fn input_hash(&self, version: &str) -> Arc<OnceCell<Fingerprint>> {
        lock(&self.input_hashes)
            .entry(version.to_string())
            .or_default()
            .clone()
    }

    /// One object version's turn (by its version row key): the records of
    /// one version in a batch (duplicates, an event and its SNS copy) take
    /// turns, so their reference writes do not cancel each other.
    pub fn version_turn(&self, version: &str) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.versions)
            .entry(version.to_string())
            .or_default()
            .clone()
    }
}

/// The state machine that runs splits, and its client.
pub(super) type SplitEngine<'a> = (&'a str, &'a dyn crate::executions::ExecutionClient);

/// One job of a record: what it takes to claim and run it.
#[derive(Clone, Copy)]
pub(super) struct JobRun<'a> {
    pub app: &'a App,
    pub invocation: &'a Invocation,
    pub rule: &'a RecipeRule,
    pub job_key: &'a str,
    /// The object version the key was computed from, and its bytes (read
    /// already when hashing them keyed the job).
    pub bytes: &'a Arc<ObjectBytes>,
    pub fingerprint: &'a Fingerprint,
    /// The queue the job's message came from: where a split job's chunks
    /// go unless `MEDIAONCE_CHUNK_QUEUE_URL` says otherwise. `None`: no
    /// job of this message is split.
    pub queue_url: Option<&'a str>,
}

/// A job's reports: what every one of them says.
pub(super) struct Reporter {
    job_key: String,
    recipe: String,
    step: String,
    version: u64,
    source: FingerprintSource,
    started: Instant,
}

impl Reporter {
    /// The report of a job its row settles without a run (`verdict`:
    /// done, busy or poisoned): reused where its outputs are, busy until
    /// the holder's lease ends, or, poisoned, `unprocessable` when the
    /// input is at fault (the message is done, its event says so) and
    /// `poisoned` when caps are spent (on to the DLQ).
    pub fn settled(&self, verdict: Verdict, row: JobRow) -> JobReport {
        match verdict {
            Verdict::Done => JobReport {
                outputs: Some(row.output_prefix),
                ..self.of(Outcome::Reused, row.attempts, None)
            },
            Verdict::Busy => JobReport {
                busy_until_ms: Some(row.lease_until_ms),
                ..self.of(
                    Outcome::Busy,
                    row.attempts,
                    Some(format!("held until {} ms", row.lease_until_ms)),
                )
            },
            _ if row.permanent => {
                self.of(Outcome::Unprocessable, row.attempts, Some(poison_reason(&row)))
            }
            _ => self.of(Outcome::Poisoned, row.attempts, Some(poison_reason(&row))),
        }
    }

    pub fn of(&self, outcome: Outcome, attempt: u64, reason: Option<String>) -> JobReport {
        JobReport {
            job_key: self.job_key.clone(),
            recipe: self.recipe.clone(),
            step: self.step.clone(),
            version: self.version,
            outcome,
            attempt,
            duration_ms: elapsed_ms(self.started),
            reason,
            busy_until_ms: None,
            input_hash_source: Some(self.source),
            outputs: None,
        }
    }
}

impl<'a> JobRun<'a> {
    /// Runs the job once per batch ([`JobRun::run`]); another record of
    /// the batch carrying it shares that report. When this record's
    /// reference (`added`) was written after that run read the job, the
    /// job is read again.
    pub async fn run_in(self, batch: &BatchJobs, added: &[String]) -> JobReport {
        let cell = batch.cell(self.job_key);
        let mut ran_here = false;
        let report = cell
            .get_or_init(|| async {
                ran_here = true;
                self.run().await
            })
            .await;
        if ran_here {
            report.clone()
        } else if report.outcome == Outcome::Waiting {
            // Split by another record of the batch: this version's own
            // claim, read after its reference, says whether it waits for
            // the execution's end (which then hands it on) or reuses.
            self.run().await
        } else if report.outcome == Outcome::Skipped {
            // The other record's object was replaced while its run read it,
            // and the claim released: this record's own object (the same
            // bytes, another key or version) still holds them, so it runs
            // the job from there. (Found by the explorer, seed 227.)
            self.run().await
        } else if added.iter().any(|key| key == self.job_key) {
            confirm_done(self.app, report.seen_again()).await
        } else {
            report.seen_again()
        }
    }

    /// Claims the job and, when this worker wins it, runs the step:
    /// claim → step → manifest → finish.
    pub async fn run(self) -> JobReport {
        let JobRun {
            app,
            invocation,
            rule,
            job_key,
            fingerprint,
            ..
        } = self;
        let report = self.reporter();
        let now = app.now_ms();
        let request = ClaimRequest {
            job_key: job_key.to_string(),
            step: rule.recipe.step.clone(),
            input_hash: fingerprint.input_hash.clone(),
            output_prefix: app.config.output_location(job_key),
            owner: app.owner_token(&invocation.request_id),
            lease_until_ms: app.config.lease.lease_until_ms(now, invocation.deadline_ms),
            now_ms: now,
            max_attempts: app.config.max_attempts,
        };
        match app.start_check(invocation, app.start_margin(rule)) {
            StartCheck::Now => {}
            StartCheck::Later(reason) => return report.of(Outcome::Deferred, 0, Some(reason)),
            // A configuration fault, not the input's: the failure event
            // says so, and the message ends in the dead-letter queue. The
            // row is judged as a claim would first: a job done before
            // (under a longer timeout) is reused, one another invocation
            // runs (a function with a longer timeout) is busy, one failed
            // for good says so; only a job nobody can run is refused.
            StartCheck::Never(reason) => {
                let row = match app.ledger.get(job_key).await {
                    Ok(row) => row,
                    Err(err) => return report.of(Outcome::Failed, 0, Some(err.to_string())),
                };
                return match row.map(|row| {
                    let verdict = judge(&row, app.now_ms(), app.config.max_attempts);
                    (verdict, row)
                }) {
                    Some((verdict @ (Verdict::Done | Verdict::Busy | Verdict::Poisoned), row)) => {
                        report.settled(verdict, row)
                    }
                    _ => report.of(Outcome::Poisoned, 0, Some(reason)),
                };
            }
        }
        match app.ledger.claim(&request).await {
            Err(err) => report.of(Outcome::Failed, 0, Some(err.to_string())),
            Ok(ClaimOutcome::Done(row)) => {
                if row.output_prefix != request.output_prefix {
                    // Made under another configuration: reused where it is.
                    tracing::info!(
                        job_key,
                        output_prefix = row.output_prefix.as_str(),
                        configured = request.output_prefix.as_str(),
                        "the job's outputs are where an earlier configuration put them"
                    );
                }
                report.settled(Verdict::Done, row)
            }
            // Held by its split's execution: `running`. A row busy for
            // another reason keeps the ARN of the execution that made it
            // (a `collecting` one, its collection begun after that
            // execution's end had handed every version on): waiting for
            // that end would strand the version without its event (found
            // by the explorer: a hand-on met a collection while the
            // execution's close had not yet followed its end task). It
            // comes back, as any busy message does.
            Ok(ClaimOutcome::Busy(row))
                if row.execution.is_some() && row.status == crate::ledger::JobStatus::Running =>
            {
                let execution = row.execution.clone().unwrap_or_default();
                self.wait_for_execution(&row, &execution, &request, &report)
                    .await
            }
            Ok(ClaimOutcome::Busy(row)) => report.settled(Verdict::Busy, row),
            Ok(ClaimOutcome::Poisoned(row)) => report.settled(Verdict::Poisoned, row),
            Ok(ClaimOutcome::Run(claim)) => self.run_claimed(&claim, &report).await,
        }
    }

    /// How this job's reports begin: its key, recipe and input hash, and
    /// the time since now.
    pub(super) fn reporter(self) -> Reporter {
        Reporter {
            job_key: self.job_key.to_string(),
            recipe: self.rule.name.clone(),
            step: self.rule.recipe.step.clone(),
            version: self.rule.recipe.version,
            source: self.fingerprint.source,
            started: Instant::now(),
        }
    }

    /// A claim won: the job split into chunks, or run here; its input
    /// replaced meanwhile releases the claim.
    async fn run_claimed(self, claim: &Claim, report: &Reporter) -> JobReport {
        let app = self.app;
        // The row's location: a takeover writes where the first attempt did.
        let Some((output_bucket, prefix)) = split_s3_location(&claim.output_prefix) else {
            let error = format!(
                "the job row's output_prefix {:?} is not an s3://bucket/prefix/ location",
                claim.output_prefix
            );
            let _ = app.ledger.finish_failed(claim, &error, app.now_ms()).await;
            return report.of(Outcome::Failed, claim.attempt, Some(error));
        };
        let input = JobInput::of(self.bytes.clone(), self.fingerprint.clone());
        let mut outputs = JobOutputs::new(app.store.clone(), output_bucket, prefix);
        let result = match self.split(&input).await {
            Ok(Some((spans, queue_url, engine))) => {
                return self
                    .start_execution(claim, &spans, queue_url, engine, report)
                    .await;
            }
            Ok(None) => self.run_step(&input, &mut outputs).await,
            Err(err) => Err(err),
        };
        if input.was_replaced() {
            // The object changed between the head and a read: what was read
            // may mix two objects and the key names the old bytes. Nothing is
            // finished under that key; the new version's own event runs it.
            let why = format!(
                "{} was replaced while the job read it (If-Match {} failed): not finished; \
             the new version's event runs it",
                input.object(),
                input.head.etag
            );
            // Released (the row deleted) only when nothing can be under the
            // job's prefix: a first claim whose run wrote nothing. A takeover
            // (of a run that died, or of a collection that stopped, whose
            // files are all still there) or a run that wrote files finishes
            // failed instead, so that the row keeps its files tracked: the
            // next claim runs the job again, or the sweep collects it once
            // no version references it. Deleting the row left them under a
            // prefix no row names, for good (found by the explorer).
            let (given_up, how) = if claim.attempt > 1 || !outputs.files().is_empty() {
                let error = StepError::Failed(why.clone());
                let finished = finish(&app.ledger, claim, Some(error), app.now_ms()).await;
                (finished, "finishing")
            } else {
                (app.ledger.release(claim).await, "releasing")
            };
            return match given_up {
                // Given up, or taken over meanwhile (the successor's run stands).
                Ok(()) | Err(FinishError::LostLease(_)) => {
                    report.of(Outcome::Skipped, claim.attempt, Some(why))
                }
                // The claim stays until its lease ends; the message comes back.
                Err(err) => report.of(
                    Outcome::Failed,
                    claim.attempt,
                    Some(format!("{why}; {how} the claim failed: {err}")),
                ),
            };
        }
        let (outcome, reason) = match &result {
            Ok(()) => (Outcome::Ran, None),
            Err(err) if err.is_permanent() => (
                Outcome::Unprocessable,
                Some(format!("failed permanently (no retry can fix it): {err}")),
            ),
            Err(err) => (Outcome::Failed, Some(err.to_string())),
        };
        let done = result.is_ok();
        match finish(&app.ledger, claim, result.err(), app.now_ms()).await {
            Ok(()) => JobReport {
                outputs: done.then(|| claim.output_prefix.clone()),
                ..report.of(outcome, claim.attempt, reason)
            },
            Err(FinishError::LostLease(_)) => report.of(
                Outcome::Busy,
                claim.attempt,
                Some("lease lost to another worker before finishing; its result stands".into()),
            ),
            Err(err) => report.of(Outcome::Failed, claim.attempt, Some(err.to_string())),
        }
    }

    /// The step's context for a run over `input`.
    fn context<'c>(&'c self, input: &'c JobInput) -> StepContext<'c> {
        StepContext {
            job_key: self.job_key,
            recipe: &self.rule.recipe,
            input,
            deadline_ms: self.invocation.deadline_ms,
            clock: self.app.clock.as_ref(),
        }
    }

    /// The chunks the step splits this job into, the queue their tasks go
    /// to (`MEDIAONCE_CHUNK_QUEUE_URL`, else the message's own) and the
    /// state machine that runs them; `None`: it runs here (a step that
    /// does not split, an input short enough, no state machine, or no
    /// queue).
    #[allow(clippy::type_complexity)]
    async fn split(
        &self,
        input: &JobInput,
    ) -> Result<Option<(Vec<ChunkSpan>, &'a str, SplitEngine<'a>)>, StepError> {
        let Some(engine) = self.app.split_engine() else {
            return Ok(None);
        };
        let Some(queue_url) = self.app.config.chunk_queue_url.as_deref().or(self.queue_url) else {
            return Ok(None);
        };
        // A chunk task trusts only a key it can derive again from a
        // version as it is: S3's SHA-256, mediaonce's computed (cached)
        // one, or its version and ETag. An upstream manifest's (a chained
        // job) is none of these: it runs whole.
        let trusted = matches!(
            self.fingerprint.source,
            FingerprintSource::S3Checksum
                | FingerprintSource::Computed
                | FingerprintSource::Cached
                | FingerprintSource::VersionEtag
        );
        if !trusted {
            return Ok(None);
        }
        let context = self.context(input);
        let Some(spans) = self.rule.step.split(&context).await? else {
            return Ok(None);
        };
        // The chunks trust a computed hash only from the cache: its write,
        // which the keying read only tried, must have happened.
        if self.fingerprint.source == FingerprintSource::Computed {
            let version = crate::identity::ObjectVersion::of(&self.bytes.head);
            let hash = &self.fingerprint.input_hash;
            self.app
                .ledger
                .cache_input_hash(&version, hash, self.app.now_ms())
                .await
                .map_err(|e| StepError::Failed(format!("caching the input hash: {e}")))?;
        }
        Ok(Some((spans, queue_url, engine)))
    }

    /// Runs the step and writes the manifest after it. A panicking step is a
    /// failed job, not a lost claim.
    async fn run_step(self, input: &JobInput, outputs: &mut JobOutputs) -> Result<(), StepError> {
        let JobRun { rule, job_key, .. } = self;
        let context = self.context(input);
        AssertUnwindSafe(rule.step.run(&context, outputs))
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| {
                Err(StepError::Failed(format!(
                    "step panicked: {}",
                    panic_message(&panic)
                )))
            })?;
        if input.was_replaced() {
            // A step that made light of the failed read must not complete it.
            return Err(StepError::Input(
                "the input was replaced while it was read".into(),
            ));
        }
        let manifest = Manifest {
            job_key: job_key.to_string(),
            input_hash: input.fingerprint.input_hash.clone(),
            recipe: rule.recipe.to_value(),
            outputs: outputs.files(),
        };
        outputs.write_manifest(&manifest).await
    }
}

/// A job reused or run by another record of the batch, confirmed by a
/// consistent read made after this record's reference: still done, or
/// busy (a collector took it meanwhile; the message comes back).
async fn confirm_done(app: &App, report: JobReport) -> JobReport {
    if !matches!(report.outcome, Outcome::Reused | Outcome::Ran) {
        return report;
    }
    match app.ledger.get(&report.job_key).await {
        Ok(Some(row)) if row.status == crate::ledger::JobStatus::Done => report,
        Ok(row) => JobReport {
            outcome: Outcome::Busy,
            reason: Some(format!(
                "the job is {} now (collected meanwhile): the message comes back",
                row.map_or("gone", |r| r.status.as_str())
            )),
            ..report
        },
        Err(err) => JobReport {
            outcome: Outcome::Failed,
            reason: Some(err.to_string()),
            ..report
        },
    }
}

pub(super) async fn finish(
    ledger: &Ledger,
    claim: &Claim,
    error: Option<StepError>,
    now_ms: u64,
) -> Result<(), FinishError> {
    match error {
        None => ledger.finish_done(claim, now_ms).await,
        Some(err) if err.is_permanent() => {
            ledger
                .finish_permanent(claim, &err.to_string(), now_ms)
                .await
        }
        Some(err) => ledger.finish_failed(claim, &err.to_string(), now_ms).await,
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic".into())
}

pub(super) fn elapsed_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}
