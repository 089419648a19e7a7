//! The batch handler: an SQS batch of S3 notifications in, the messages that
//! must come back out (an SQS partial batch response).
//!
//! Messages run in tasks (a panic fails only its own message), at most
//! `concurrency` at a time; those of one FIFO message group run in order in
//! one task. Jobs with the same key in one batch are claimed once. Inside
//! Lambda no job starts too close to the deadline, and the response is sent
//! before it.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use futures::FutureExt;
use tokio::sync::{OnceCell, Semaphore};
use tokio::task::JoinHandle;

use crate::config::{split_s3_location, Config, ConfigError, RecipeRule};
use crate::event::{parse_body, EventKind, Notification, S3Record};
use crate::fifo::lanes;
use crate::fingerprint::{fingerprint, replaced_since_event, Fingerprint, ObjectHead};
use crate::key::job_key;
use crate::lease::{Clock, SystemClock};
use crate::ledger::{
    poison_reason, Claim, ClaimOutcome, ClaimRequest, FinishError, Ledger, LedgerError,
};
use crate::queue::{busy_delay_secs, queue_url_from_arn, Queue};
pub use crate::report::{BatchReport, JobReport, MessageReport, Outcome};
use crate::step::{JobInput, JobOutputs, Manifest, StepContext, StepError};
use crate::steps::StepRegistry;
use crate::store::{ObjectRef, ObjectStore};

/// The invocation a batch arrived in.
#[derive(Debug, Clone, Default)]
pub struct Invocation {
    /// Lambda's request id, or any id of the caller's; part of each owner token.
    pub request_id: String,
    /// The invocation deadline in epoch milliseconds, inside Lambda.
    pub deadline_ms: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("configuration error: {0}")]
    Config(#[from] ConfigError),
    #[error("the claim table is not usable: {0}")]
    Table(#[from] LedgerError),
}

/// Time kept back from the invocation deadline to send the response.
const RESPONSE_RESERVE_MS: u64 = 1_000;

/// Everything a batch needs: configuration (recipes bound to their steps)
/// and clients.
#[derive(Debug)]
pub struct App {
    pub config: Config,
    pub ledger: Ledger,
    pub store: ObjectStore,
    pub queue: Queue,
    clock: Arc<dyn Clock>,
    /// The owner tokens' and the busy jitter's randomness: seedable, so that
    /// a run (a test, the chaos soak, a simulation) can be repeated.
    rng: Mutex<fastrand::Rng>,
}

impl App {
    pub fn new(config: Config, ledger: Ledger, store: ObjectStore, queue: Queue) -> Self {
        App {
            config,
            ledger,
            store,
            queue,
            clock: Arc::new(SystemClock),
            rng: Mutex::new(fastrand::Rng::new()),
        }
    }

    /// The same, reading the time from `clock`.
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The same, drawing owner tokens and jitter from a generator seeded
    /// with `seed`: equal seeds, equal draws.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.rng = Mutex::new(fastrand::Rng::with_seed(seed));
        self
    }

    /// A fresh fencing token for one attempt: `<request id>/<uuid v4>`.
    fn owner_token(&self, request_id: &str) -> String {
        let bytes = lock(&self.rng).u128(..).to_le_bytes();
        format!(
            "{request_id}/{}",
            uuid::Builder::from_random_bytes(bytes).into_uuid()
        )
    }

    /// Up to 1 s of jitter for a busy message's return.
    fn jitter_ms(&self) -> u64 {
        lock(&self.rng).u64(0..=1_000)
    }

    /// The time on this worker's clock, in epoch milliseconds.
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The time a job of `rule` needs left before the deadline to start:
    /// the configured margin plus its step's declared need. Each job has its
    /// own, so a slow step's need does not hold back quick ones.
    pub fn start_margin(&self, rule: &RecipeRule) -> Duration {
        self.config.deadline_margin + rule.step.time_needed()
    }

    /// Why a job needing `margin` may not start now, if it may not.
    fn too_late_to_start(&self, invocation: &Invocation, margin: Duration) -> Option<String> {
        let deadline = invocation.deadline_ms?;
        let remaining = deadline.saturating_sub(self.now_ms());
        let margin = u64::try_from(margin.as_millis()).unwrap_or(u64::MAX);
        (remaining < margin).then(|| {
            format!("not started: {remaining} ms left before the invocation deadline, {margin} ms needed")
        })
    }

    /// Reads the configuration (binding its recipes to `steps`) and builds
    /// the AWS clients, then checks the table, so that a misconfiguration
    /// fails at start-up with its name.
    pub async fn from_env(steps: StepRegistry) -> Result<Self, StartupError> {
        let config = Config::from_env(&steps)?;
        let sdk = crate::aws::load_sdk_config().await;
        let app = App::new(
            config.clone(),
            Ledger::dynamodb(crate::aws::dynamodb_client(&sdk), config.table.clone()),
            ObjectStore::s3(
                crate::aws::s3_client(&sdk),
                config.expected_bucket_owner.clone(),
            ),
            Queue::sqs(crate::aws::sqs_client(&sdk)),
        );
        app.ledger.check_table().await?;
        Ok(app)
    }
}

/// Jobs seen in this batch, so that one key is claimed once.
#[derive(Default)]
struct BatchJobs {
    jobs: Mutex<HashMap<String, Arc<OnceCell<JobReport>>>>,
}

impl BatchJobs {
    fn cell(&self, key: &str) -> Arc<OnceCell<JobReport>> {
        lock(&self.jobs).entry(key.to_string()).or_default().clone()
    }
}

/// Handles one SQS batch. Messages run concurrently, except that those of
/// one FIFO message group run in order ([`crate::fifo`]). Inside Lambda it
/// returns before the invocation deadline: a message still unfinished then
/// is a batch item failure (its task is stopped; its claim expires with its
/// lease).
pub async fn handle_batch(app: Arc<App>, event: SqsEvent, invocation: Invocation) -> BatchReport {
    let batch = Arc::new(BatchJobs::default());
    let invocation = Arc::new(invocation);
    let permits = Arc::new(Semaphore::new(app.config.concurrency));
    let messages = event.records;
    // A message without an id cannot be named in the response; an empty
    // identifier makes Lambda retry the whole batch, which loses nothing.
    let ids: Vec<String> = messages
        .iter()
        .map(|m| m.message_id.clone().unwrap_or_default())
        .collect();
    let lanes = lanes(&messages);
    let slots: Arc<Mutex<Vec<Option<MessageReport>>>> =
        Arc::new(Mutex::new(vec![None; messages.len()]));
    let mut messages: Vec<Option<SqsMessage>> = messages.into_iter().map(Some).collect();
    let tasks: Vec<JoinHandle<()>> = lanes
        .iter()
        .map(|lane| {
            let lane: Vec<(usize, SqsMessage)> = lane
                .iter()
                .filter_map(|&i| Some((i, messages[i].take()?)))
                .collect();
            let (app, batch, invocation, permits, slots) = (
                app.clone(),
                batch.clone(),
                invocation.clone(),
                permits.clone(),
                slots.clone(),
            );
            tokio::spawn(async move {
                let mut earlier_failed = false;
                for (index, message) in lane {
                    let report = if earlier_failed {
                        let message_id = message.message_id.unwrap_or_default();
                        tracing::warn!(
                            message_id,
                            "an earlier message of its FIFO group failed: not run, it comes back"
                        );
                        failed_message(
                            message_id,
                            "an earlier message of its FIFO group failed in this batch",
                        )
                    } else {
                        // Fair: messages start in the order they came.
                        let _permit = permits.acquire().await;
                        process_message(&app, &batch, &invocation, message).await
                    };
                    earlier_failed |= report.must_retry();
                    lock(&slots)[index] = Some(report);
                }
            })
        })
        .collect();

    let cutoff = invocation.deadline_ms.map(|deadline| {
        let left = deadline
            .saturating_sub(RESPONSE_RESERVE_MS)
            .saturating_sub(app.now_ms());
        tokio::time::Instant::now() + Duration::from_millis(left)
    });
    let mut fates: Vec<Option<String>> = Vec::with_capacity(tasks.len());
    for mut task in tasks {
        let finished = match cutoff {
            Some(cutoff) => tokio::time::timeout_at(cutoff, &mut task).await.ok(),
            None => Some((&mut task).await),
        };
        fates.push(match finished {
            Some(Ok(())) => None,
            Some(Err(err)) => Some(format!("message task failed: {err}")),
            None => {
                task.abort();
                Some("unfinished at the invocation deadline".to_string())
            }
        });
    }
    let mut slots = lock(&slots);
    let mut reports = Vec::with_capacity(ids.len());
    for (lane, fate) in lanes.iter().zip(&fates) {
        for &index in lane {
            let report = slots[index].take().unwrap_or_else(|| {
                let error = fate
                    .clone()
                    .unwrap_or_else(|| "message task ended without a report".into());
                tracing::warn!(message_id = ids[index], error, "message comes back");
                failed_message(ids[index].clone(), &error)
            });
            reports.push((index, report));
        }
    }
    reports.sort_by_key(|(index, _)| *index);
    BatchReport {
        messages: reports.into_iter().map(|(_, report)| report).collect(),
    }
}

fn failed_message(message_id: String, error: &str) -> MessageReport {
    MessageReport {
        message_id,
        jobs: Vec::new(),
        error: Some(error.to_string()),
    }
}

/// Locks a mutex, even one a panicking task held: the data are reports,
/// whole or absent.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn process_message(
    app: &App,
    batch: &BatchJobs,
    invocation: &Invocation,
    message: SqsMessage,
) -> MessageReport {
    let message_id = message.message_id.clone().unwrap_or_default();
    let body = message.body.as_deref().unwrap_or_default();
    let report = process_body(app, batch, invocation, message_id, body).await;
    if let Some(busy_until_ms) = report
        .must_retry()
        .then(|| report.busy_until_ms())
        .flatten()
    {
        delay_busy_message(app, &report.message_id, &message, busy_until_ms).await;
    }
    report
}

/// Hands a busy message back for when its holder's lease ends. Failing to is
/// harmless: it comes back after the queue's visibility timeout instead.
async fn delay_busy_message(app: &App, message_id: &str, message: &SqsMessage, busy_until_ms: u64) {
    let (Some(arn), Some(receipt_handle)) = (&message.event_source_arn, &message.receipt_handle)
    else {
        tracing::warn!(
            message_id,
            "busy message has no queue ARN or receipt handle: left as it is"
        );
        return;
    };
    let Some(queue_url) = queue_url_from_arn(arn) else {
        tracing::warn!(
            message_id,
            arn,
            "busy message's eventSourceARN is not an SQS queue: left as it is"
        );
        return;
    };
    let seconds = busy_delay_secs(busy_until_ms, app.now_ms(), app.jitter_ms());
    match app.queue.delay(&queue_url, receipt_handle, seconds).await {
        Ok(()) => tracing::info!(
            message_id,
            seconds,
            "busy message comes back when the holder's lease ends"
        ),
        Err(err) => tracing::warn!(message_id, error = %err, "could not delay the busy message"),
    }
}

async fn process_body(
    app: &App,
    batch: &BatchJobs,
    invocation: &Invocation,
    message_id: String,
    body: &str,
) -> MessageReport {
    let records = match parse_body(body) {
        Ok(Notification::Records(records)) => records,
        Ok(Notification::TestEvent) => {
            tracing::info!(message_id, "s3:TestEvent acknowledged");
            return MessageReport {
                message_id,
                jobs: Vec::new(),
                error: None,
            };
        }
        Err(err) => {
            tracing::error!(message_id, error = %err, "message body is not a usable S3 notification");
            return MessageReport {
                message_id,
                jobs: Vec::new(),
                error: Some(err.to_string()),
            };
        }
    };
    let mut jobs = Vec::new();
    for record in &records {
        jobs.extend(process_record(app, batch, invocation, &message_id, record).await);
    }
    MessageReport {
        message_id,
        jobs,
        error: None,
    }
}

async fn process_record(
    app: &App,
    batch: &BatchJobs,
    invocation: &Invocation,
    message_id: &str,
    record: &S3Record,
) -> Vec<JobReport> {
    let (bucket, key, event) = (&record.bucket, &record.key, &record.event_name);
    match record.kind() {
        EventKind::Created => {}
        EventKind::Removed => {
            tracing::info!(
                message_id,
                bucket,
                key,
                event,
                "object removed: acknowledged, no job"
            );
            return Vec::new();
        }
        EventKind::Other => {
            tracing::info!(
                message_id,
                bucket,
                key,
                event,
                "not an ObjectCreated event: acknowledged, no job"
            );
            return Vec::new();
        }
    }
    if app.config.is_own_output(bucket, key) {
        tracing::info!(
            message_id,
            bucket,
            key,
            "object is one of our outputs: acknowledged, no job (recursion guard)"
        );
        return Vec::new();
    }
    let rules: Vec<&RecipeRule> = app
        .config
        .recipes
        .iter()
        .filter(|r| r.key_match.matches(key))
        .collect();
    if rules.is_empty() {
        tracing::info!(
            message_id,
            bucket,
            key,
            "no recipe matches the key: acknowledged, no job"
        );
        return Vec::new();
    }

    let started = Instant::now();
    let object = ObjectRef {
        bucket: bucket.clone(),
        key: key.clone(),
        version_id: record.version_id.clone(),
        if_match: None,
    };
    // Not even the quickest of the record's jobs could start: no HeadObject.
    let quickest = rules
        .iter()
        .map(|rule| app.start_margin(rule))
        .min()
        .unwrap_or_default();
    let head = match app.too_late_to_start(invocation, quickest) {
        Some(reason) => Err((Outcome::Deferred, reason)),
        None => head_for_record(app, record, &object).await,
    };
    let head = match head {
        Ok(head) => head,
        // No input hash, no key: report each recipe's job without claiming it.
        Err((outcome, reason)) => {
            return rules
                .iter()
                .map(|rule| {
                    let report = JobReport {
                        job_key: String::new(),
                        step: rule.recipe.step.clone(),
                        outcome,
                        attempt: 0,
                        duration_ms: elapsed_ms(started),
                        reason: Some(reason.clone()),
                        busy_until_ms: None,
                    };
                    log_job(&report, message_id, &object);
                    report
                })
                .collect();
        }
    };

    let fingerprint = fingerprint(&head);
    let mut reports = Vec::with_capacity(rules.len());
    for rule in rules {
        let job_key = job_key(&fingerprint.input_hash, &rule.recipe_hash);
        let cell = batch.cell(&job_key);
        let mut ran_here = false;
        let report = cell
            .get_or_init(|| async {
                ran_here = true;
                run_job(app, invocation, rule, &job_key, &head, &fingerprint).await
            })
            .await;
        let report = if ran_here {
            report.clone()
        } else {
            report.seen_again()
        };
        log_job(&report, message_id, &object);
        reports.push(report);
    }
    reports
}

/// HeadObject of the record's object version; `Err` with the outcome when
/// there is nothing to claim.
async fn head_for_record(
    app: &App,
    record: &S3Record,
    object: &ObjectRef,
) -> Result<ObjectHead, (Outcome, String)> {
    match app.store.head(object).await {
        Ok(Some(head))
            if replaced_since_event(
                record.etag.as_deref(),
                record.version_id.as_deref(),
                &head,
            ) =>
        {
            Err((
                Outcome::Skipped,
                format!(
                    "{object} was replaced since the event (ETag {} is now {})",
                    record.etag.as_deref().unwrap_or(""),
                    head.etag
                ),
            ))
        }
        Ok(Some(head)) => Ok(head),
        Ok(None) => Err((Outcome::Skipped, format!("{object} is gone (NoSuchKey)"))),
        Err(err) => Err((Outcome::Failed, err.to_string())),
    }
}

/// Claims one job and, when this worker wins it, runs the step.
async fn run_job(
    app: &App,
    invocation: &Invocation,
    rule: &RecipeRule,
    job_key: &str,
    head: &ObjectHead,
    fingerprint: &Fingerprint,
) -> JobReport {
    let started = Instant::now();
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
    let report = |outcome, attempt, reason: Option<String>| JobReport {
        job_key: job_key.to_string(),
        step: rule.recipe.step.clone(),
        outcome,
        attempt,
        duration_ms: elapsed_ms(started),
        reason,
        busy_until_ms: None,
    };
    if let Some(reason) = app.too_late_to_start(invocation, app.start_margin(rule)) {
        return report(Outcome::Deferred, 0, Some(reason));
    }
    let claim = match app.ledger.claim(&request).await {
        Err(err) => return report(Outcome::Failed, 0, Some(err.to_string())),
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
            return report(Outcome::Reused, row.attempts, None);
        }
        Ok(ClaimOutcome::Busy(row)) => {
            return JobReport {
                busy_until_ms: Some(row.lease_until_ms),
                ..report(
                    Outcome::Busy,
                    row.attempts,
                    Some(format!("held until {} ms", row.lease_until_ms)),
                )
            }
        }
        Ok(ClaimOutcome::Poisoned(row)) => {
            return report(Outcome::Poisoned, row.attempts, Some(poison_reason(&row)));
        }
        Ok(ClaimOutcome::Run(claim)) => claim,
    };

    // The row's location: a takeover writes where the first attempt did.
    let Some((output_bucket, prefix)) = split_s3_location(&claim.output_prefix) else {
        let error = format!(
            "the job row's output_prefix {:?} is not an s3://bucket/prefix/ location",
            claim.output_prefix
        );
        let _ = app.ledger.finish_failed(&claim, &error, app.now_ms()).await;
        return report(Outcome::Failed, claim.attempt, Some(error));
    };
    let input = JobInput::new(app.store.clone(), head.clone(), fingerprint.clone());
    let mut outputs = JobOutputs::new(app.store.clone(), output_bucket, prefix);
    let result = run_step(app, invocation, rule, job_key, &input, &mut outputs).await;
    if input.was_replaced() {
        // The object changed between the head and a read: what was read
        // may mix two objects and the key names the old bytes. Nothing is
        // finished under that key; the new version's own event runs it.
        let why = format!(
            "{} was replaced while the job read it (If-Match {} failed): not finished; \
             the new version's event runs it",
            input.object(),
            head.etag
        );
        return match app.ledger.release(&claim).await {
            Ok(()) => report(Outcome::Skipped, claim.attempt, Some(why)),
            // Taken over meanwhile: the successor's run stands.
            Err(FinishError::LostLease(_)) => report(Outcome::Skipped, claim.attempt, Some(why)),
            // The claim stays until its lease ends; the message comes back.
            Err(err) => report(
                Outcome::Failed,
                claim.attempt,
                Some(format!("{why}; releasing the claim failed: {err}")),
            ),
        };
    }
    let (outcome, reason) = match &result {
        Ok(()) => (Outcome::Ran, None),
        Err(err) if err.is_permanent() => (
            Outcome::Poisoned,
            Some(format!("failed permanently (no retry can fix it): {err}")),
        ),
        Err(err) => (Outcome::Failed, Some(err.to_string())),
    };
    match finish(&app.ledger, &claim, result.err(), app.now_ms()).await {
        Ok(()) => report(outcome, claim.attempt, reason),
        Err(FinishError::LostLease(_)) => report(
            Outcome::Busy,
            claim.attempt,
            Some("lease lost to another worker before finishing; its result stands".into()),
        ),
        Err(err) => report(Outcome::Failed, claim.attempt, Some(err.to_string())),
    }
}

/// Runs the step and writes the manifest after it. A panicking step is a
/// failed job, not a lost claim.
async fn run_step(
    app: &App,
    invocation: &Invocation,
    rule: &RecipeRule,
    job_key: &str,
    input: &JobInput,
    outputs: &mut JobOutputs,
) -> Result<(), StepError> {
    let context = StepContext {
        job_key,
        recipe: &rule.recipe,
        input,
        deadline_ms: invocation.deadline_ms,
        clock: app.clock.as_ref(),
    };
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

async fn finish(
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

fn elapsed_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// One log event per job outcome: a warning when the message comes back.
fn log_job(report: &JobReport, message_id: &str, object: &ObjectRef) {
    macro_rules! job_event {
        ($level:expr) => {
            tracing::event!(
                $level,
                job_key = report.job_key.as_str(),
                step = report.step.as_str(),
                outcome = report.outcome.as_str(),
                attempt = report.attempt,
                duration_ms = report.duration_ms,
                message_id,
                object = %object,
                reason = report.reason.as_deref(),
                "job"
            )
        };
    }
    if report.outcome.must_retry() {
        job_event!(tracing::Level::WARN)
    } else {
        job_event!(tracing::Level::INFO)
    }
}

#[cfg(test)]
mod tests {
    //! The handler on in-memory clients: no emulators, no network. The
    //! integration tests under `tests/` run the same paths on the emulators.

    use std::collections::HashMap;

    use super::*;
    use crate::key::sha256_hex;
    use crate::ledger::memory::InMemoryTable;
    use crate::ledger::{JobRow, JobStatus};
    use crate::queue::RecordingQueue;
    use crate::store::memory::InMemoryObjects;

    const ARN: &str = "arn:aws:sqs:us-east-1:123456789012:jobs";

    struct Fixture {
        app: Arc<App>,
        objects: Arc<InMemoryObjects>,
        queue: Arc<RecordingQueue>,
    }

    fn fixture() -> Fixture {
        fixture_with(None)
    }

    fn fixture_with(recipes: Option<&str>) -> Fixture {
        match recipes {
            Some(recipes) => fixture_with_vars(&[("MEDIAONCE_RECIPES", recipes)]),
            None => fixture_with_vars(&[]),
        }
    }

    /// An app on in-memory clients with the default configuration.
    fn fixture_app() -> App {
        let steps = StepRegistry::builtin();
        let config = Config::from_lookup(
            |name| match name {
                "MEDIAONCE_TABLE" => Some("jobs".into()),
                "MEDIAONCE_OUTPUT_BUCKET" => Some("out".into()),
                _ => None,
            },
            &steps,
        )
        .unwrap();
        App::new(
            config,
            Ledger::new(InMemoryTable::new("jobs")),
            ObjectStore::new(InMemoryObjects::new()),
            Queue::new(Arc::new(RecordingQueue::default())),
        )
    }

    fn fixture_with_vars(extra: &[(&str, &str)]) -> Fixture {
        let steps = StepRegistry::builtin();
        let mut vars = HashMap::from([
            ("MEDIAONCE_TABLE", "jobs"),
            ("MEDIAONCE_OUTPUT_BUCKET", "in"),
        ]);
        vars.extend(extra.iter().copied());
        let config =
            Config::from_lookup(|name| vars.get(name).map(|v| v.to_string()), &steps).unwrap();
        let objects = InMemoryObjects::new();
        // As App::from_env gives the S3 client the configured owner.
        objects.expect_owner(config.expected_bucket_owner.clone());
        let queue = Arc::new(RecordingQueue::default());
        let app = App::new(
            config,
            Ledger::new(InMemoryTable::new("jobs")),
            ObjectStore::new(objects.clone()),
            Queue::new(queue.clone()),
        );
        Fixture {
            app: Arc::new(app),
            objects,
            queue,
        }
    }

    fn message(id: &str, key: &str, etag: &str) -> SqsMessage {
        let body = serde_json::json!({"Records": [{
            "eventName": "ObjectCreated:Put",
            "s3": {"bucket": {"name": "in"}, "object": {"key": key, "eTag": etag, "size": 1}}
        }]});
        let mut m = SqsMessage::default();
        m.message_id = Some(id.into());
        m.receipt_handle = Some(format!("receipt-{id}"));
        m.body = Some(body.to_string());
        m.event_source_arn = Some(ARN.into());
        m
    }

    async fn handle(app: &Arc<App>, messages: Vec<SqsMessage>) -> BatchReport {
        let mut event = SqsEvent::default();
        event.records = messages;
        let invocation = Invocation {
            request_id: "req".into(),
            deadline_ms: Some(app.now_ms() + 60_000),
        };
        handle_batch(app.clone(), event, invocation).await
    }

    #[tokio::test]
    async fn runs_once_writes_outputs_then_reuses() {
        let f = fixture();
        let etag = f.objects.insert("in", "a.bin", b"abc", true);
        let first = handle(
            &f.app,
            vec![message("1", "a.bin", &etag), message("2", "a.bin", &etag)],
        )
        .await;
        let outcomes: Vec<Outcome> = first.jobs().map(|j| j.outcome).collect();
        assert_eq!(outcomes, [Outcome::Ran, Outcome::Reused]);
        assert!(first.response().batch_item_failures.is_empty());
        let key = first.jobs().next().unwrap().job_key.clone();
        assert_eq!(
            key,
            job_key(&sha256_hex(b"abc"), &f.app.config.recipes[0].recipe_hash)
        );
        assert_eq!(
            f.objects.keys("in", "derived/"),
            [
                format!("derived/{key}/_manifest.json"),
                format!("derived/{key}/probe.json")
            ]
        );
        let again = handle(&f.app, vec![message("3", "a.bin", &etag)]).await;
        assert_eq!(again.jobs().next().unwrap().outcome, Outcome::Reused);
        assert_eq!(
            f.app.ledger.get(&key).await.unwrap().unwrap().status,
            JobStatus::Done
        );
    }

    #[tokio::test]
    async fn a_slow_steps_need_defers_only_its_own_job() {
        // hls-package declares 60 + 10 s, probe nothing; 5 s margin each.
        let f = fixture_with(Some(
            r#"[{"step":"hls-package","version":1,"params":{"ladder":[360]}},
                {"step":"probe","version":1,"params":{}}]"#,
        ));
        assert_eq!(
            f.app.start_margin(&f.app.config.recipes[0]),
            Duration::from_secs(75)
        );
        assert_eq!(
            f.app.start_margin(&f.app.config.recipes[1]),
            Duration::from_secs(5)
        );
        let etag = f.objects.insert("in", "a.mp4", b"not yet a movie", true);
        let mut event = SqsEvent::default();
        event.records = vec![message("1", "a.mp4", &etag)];
        let invocation = Invocation {
            request_id: "req".into(),
            deadline_ms: Some(f.app.now_ms() + 30_000),
        };
        let report = handle_batch(f.app.clone(), event, invocation).await;
        let outcomes: Vec<(&str, Outcome)> = report
            .jobs()
            .map(|j| (j.step.as_str(), j.outcome))
            .collect();
        assert_eq!(
            outcomes,
            [("hls-package", Outcome::Deferred), ("probe", Outcome::Ran)]
        );
        // The message comes back for the deferred job; probe's is then reused.
        assert_eq!(report.response().batch_item_failures.len(), 1);
    }

    #[tokio::test]
    async fn a_busy_message_is_handed_back_for_when_the_lease_ends() {
        let f = fixture();
        let etag = f.objects.insert("in", "b.bin", b"held", true);
        let key = job_key(&sha256_hex(b"held"), &f.app.config.recipes[0].recipe_hash);
        let lease_until_ms = f.app.now_ms() + 5_000;
        f.app
            .ledger
            .claim(&ClaimRequest {
                job_key: key.clone(),
                step: "probe".into(),
                input_hash: sha256_hex(b"held"),
                output_prefix: "s3://in/derived/".into(),
                owner: "elsewhere".into(),
                lease_until_ms,
                now_ms: f.app.now_ms(),
                max_attempts: 3,
            })
            .await
            .unwrap();
        let report = handle(&f.app, vec![message("1", "b.bin", &etag)]).await;
        assert_eq!(report.jobs().next().unwrap().outcome, Outcome::Busy);
        let changes = f.queue.changes();
        assert_eq!(changes.len(), 1);
        let (url, receipt, seconds) = &changes[0];
        assert_eq!(url, "https://sqs.us-east-1.amazonaws.com/123456789012/jobs");
        assert_eq!(receipt, "receipt-1");
        assert!((5..=7).contains(seconds), "{seconds}");
        let row: JobRow = f.app.ledger.get(&key).await.unwrap().unwrap();
        assert_eq!(row.owner, "elsewhere");
    }

    /// A clock the test moves.
    #[derive(Debug, Default)]
    struct ManualClock(std::sync::atomic::AtomicU64);

    impl Clock for Arc<ManualClock> {
        fn now_ms(&self) -> u64 {
            self.0.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    #[tokio::test]
    async fn an_input_that_kills_its_worker_every_time_ends_poisoned() {
        use crate::faults::{Call, FaultPlan};
        use crate::ledger::faults::FaultyTable;
        let config = fixture_app().config;
        let objects = InMemoryObjects::new();
        let etag = objects.insert("in", "killer.bin", b"kills", true);
        let clock = Arc::new(ManualClock::default());
        clock
            .0
            .store(1_000_000, std::sync::atomic::Ordering::SeqCst);
        // Every run dies before it can finish: nothing records a failure.
        let plan = Arc::new(FaultPlan::new());
        plan.fail(Call::Finish, usize::MAX, "the worker died");
        let app = Arc::new(
            App::new(
                config,
                Ledger::new(FaultyTable::new(InMemoryTable::new("jobs"), plan)),
                ObjectStore::new(objects.clone()),
                Queue::new(Arc::new(RecordingQueue::default())),
            )
            .with_clock(clock.clone()),
        );
        let max_runs = crate::ledger::max_runs(app.config.max_attempts);
        let mut outcomes = Vec::new();
        for delivery in 0..max_runs + 2 {
            let report = handle(
                &app,
                vec![message(&delivery.to_string(), "killer.bin", &etag)],
            )
            .await;
            outcomes.push(report.jobs().next().unwrap().outcome);
            // The next delivery comes after the lease (deadline + margin).
            clock
                .0
                .fetch_add(120_000, std::sync::atomic::Ordering::SeqCst);
        }
        let runs = outcomes.iter().filter(|o| **o == Outcome::Failed).count() as u64;
        assert_eq!(runs, max_runs, "{outcomes:?}");
        assert_eq!(
            &outcomes[max_runs as usize..],
            [Outcome::Poisoned, Outcome::Poisoned]
        );
    }

    #[test]
    fn owner_tokens_and_jitter_repeat_from_a_seed() {
        let app = |seed| fixture_app().with_seed(seed);
        let (a, b, c) = (app(7), app(7), app(8));
        let draws = |app: &App| {
            (
                app.owner_token("req"),
                app.owner_token("req"),
                app.jitter_ms(),
            )
        };
        assert_eq!(draws(&a), draws(&b));
        let (first, second, jitter) = draws(&c);
        assert_ne!(first, second, "a token per attempt");
        assert_ne!((first.clone(), second), (draws(&a).0, draws(&a).1));
        assert!(jitter <= 1_000);
        let uuid = first.strip_prefix("req/").unwrap();
        assert_eq!(uuid::Uuid::parse_str(uuid).unwrap().get_version_num(), 4);
    }

    #[tokio::test]
    async fn a_takeover_writes_where_the_row_says_and_reuse_stays_there() {
        let f = fixture();
        let etag = f.objects.insert("in", "moved.bin", b"moved", true);
        let key = job_key(&sha256_hex(b"moved"), &f.app.config.recipes[0].recipe_hash);
        // A first attempt under an earlier configuration failed.
        let earlier = format!("s3://in/earlier/{key}/");
        let now = f.app.now_ms();
        let ClaimOutcome::Run(claim) = f
            .app
            .ledger
            .claim(&ClaimRequest {
                job_key: key.clone(),
                step: "probe".into(),
                input_hash: sha256_hex(b"moved"),
                output_prefix: earlier.clone(),
                owner: "earlier/1".into(),
                lease_until_ms: now + 5_000,
                now_ms: now,
                max_attempts: 3,
            })
            .await
            .unwrap()
        else {
            panic!("not claimed")
        };
        f.app
            .ledger
            .finish_failed(&claim, "S3 was down", now)
            .await
            .unwrap();

        let report = handle(&f.app, vec![message("1", "moved.bin", &etag)]).await;
        let job = report.jobs().next().unwrap();
        assert_eq!((job.outcome, job.attempt), (Outcome::Ran, 2), "{job:?}");
        let row = f.app.ledger.get(&key).await.unwrap().unwrap();
        assert_eq!(row.output_prefix, earlier);
        assert_eq!(
            f.objects.keys("in", ""),
            [
                format!("earlier/{key}/_manifest.json"),
                format!("earlier/{key}/probe.json"),
                "moved.bin".to_string(),
            ]
        );
        // Done there: reused there, nothing written where the configuration says.
        let report = handle(&f.app, vec![message("2", "moved.bin", &etag)]).await;
        assert_eq!(report.jobs().next().unwrap().outcome, Outcome::Reused);
        assert!(f.objects.keys("in", "derived/").is_empty());
    }

    #[tokio::test]
    async fn buckets_of_another_account_are_neither_read_nor_written() {
        let owner = [("MEDIAONCE_EXPECTED_BUCKET_OWNER", "111111111111")];
        let f = fixture_with_vars(&[owner[0], ("MEDIAONCE_OUTPUT_BUCKET", "out")]);
        f.objects.set_bucket_owner("in", "111111111111");
        f.objects.set_bucket_owner("out", "111111111111");
        let etag = f.objects.insert("in", "ours.bin", b"ours", true);
        let report = handle(&f.app, vec![message("1", "ours.bin", &etag)]).await;
        assert_eq!(report.jobs().next().unwrap().outcome, Outcome::Ran);

        // The input bucket's name now belongs to another account.
        f.objects.set_bucket_owner("in", "222222222222");
        let etag = f.objects.insert("in", "theirs.bin", b"theirs", true);
        let report = handle(&f.app, vec![message("2", "theirs.bin", &etag)]).await;
        assert_eq!(report.response().batch_item_failures.len(), 1);
        let job = report.jobs().next().unwrap();
        assert_eq!(job.outcome, Outcome::Failed);
        let reason = job.reason.clone().unwrap();
        assert!(reason.contains("HTTP 403 AccessDenied"), "{reason}");
        assert!(
            reason.contains("not be owned by account 111111111111, which MEDIAONCE_EXPECTED_BUCKET_OWNER expects"),
            "{reason}"
        );

        // The output bucket's: the job fails and nothing is written there.
        f.objects.set_bucket_owner("in", "111111111111");
        f.objects.set_bucket_owner("out", "222222222222");
        let etag = f.objects.insert("in", "new.bin", b"new", true);
        let report = handle(&f.app, vec![message("3", "new.bin", &etag)]).await;
        let job = report.jobs().next().unwrap();
        assert_eq!(job.outcome, Outcome::Failed, "{job:?}");
        assert!(
            job.reason
                .as_deref()
                .unwrap()
                .contains("MEDIAONCE_EXPECTED_BUCKET_OWNER"),
            "{job:?}"
        );
        let key = job_key(&sha256_hex(b"new"), &f.app.config.recipes[0].recipe_hash);
        assert!(f.objects.keys("out", &format!("derived/{key}/")).is_empty());
    }

    #[tokio::test]
    async fn a_replaced_object_is_skipped_and_our_outputs_are_ignored() {
        let f = fixture();
        f.objects.insert("in", "c.bin", b"new bytes", false);
        let report = handle(
            &f.app,
            vec![
                message("1", "c.bin", "etag-of-the-old-bytes"),
                message("2", "derived/x/probe.json", "e"),
            ],
        )
        .await;
        let outcomes: Vec<Outcome> = report.jobs().map(|j| j.outcome).collect();
        assert_eq!(outcomes, [Outcome::Skipped]);
        assert!(report.response().batch_item_failures.is_empty());
        assert!(f.objects.keys("in", "derived/").is_empty());
    }
}
