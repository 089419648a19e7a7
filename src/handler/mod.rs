//! The batch handler: an SQS batch of S3 notifications in, the messages that
//! must come back out (an SQS partial batch response).
//!
//! By level, each a module:
//! - [`batch`]: the batch: lanes (FIFO groups), concurrency, the deadline
//!   cut-off, the partial batch response;
//! - [`record`]: a message's body and its S3 records: parse, filter, head,
//!   and the jobs of the matching recipes;
//! - [`identify`]: a record's input hash: from the head, the hash cache, or
//!   one read of the object that the record's jobs then share;
//! - [`job`]: one job: claim → step → manifest → finish;
//! - [`chain`]: the jobs chained to done ones ([`crate::pipeline`]): keyed
//!   by the upstream manifest, referenced, run or handed on;
//! - [`split`]: the tasks of a split's Step Functions execution
//!   (chunk, join, failure, end), each answered by its task token (the
//!   claimant's side, starting it, is [`job`]'s);
//! - [`references`]: after a create's jobs, the version's references; a
//!   removal's release;
//! - [`outputs`]: where an object's outputs are (`mediaonce outputs`);
//! - [`collect`]: a job nothing references loses its outputs, then its row;
//! - [`rebuild`]: the references of objects older than the count
//!   (`mediaonce refs rebuild`, `mediaonce refs seal`);
//! - [`busy`]: handing a busy message back for when its holder is done;
//! - [`log`]: the one log event of each job outcome.
//!
//! Messages run in tasks (a panic fails only its own message), at most
//! `concurrency` at a time; those of one FIFO message group run in order in
//! one task. Jobs with the same key in one batch are claimed once. Inside
//! Lambda no job starts too close to the deadline, and the response is sent
//! before it.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::bus::Bus;
use crate::executions::ExecutionClient;
use crate::config::{Config, ConfigError, RecipeRule};
use crate::lease::{Clock, SystemClock};
use crate::ledger::{Ledger, LedgerError};
use crate::queue::Queue;
pub use crate::report::{BatchReport, BatchUsage, JobReport, MessageReport, Outcome};
use crate::steps::StepRegistry;
use crate::store::ObjectStore;

mod batch;
mod busy;
mod chain;
mod completion;
pub mod collect;
mod identify;
mod job;
mod log;
mod outputs;
mod rebuild;
mod record;
mod references;
mod split;

pub use batch::handle_batch;
pub use collect::Collected;
// For the tests' clock: how far to move it past a collector's lease, and
// past a release's mark.
#[cfg(any(test, feature = "testing"))]
pub use collect::COLLECT_LEASE;
#[cfg(any(test, feature = "testing"))]
pub use references::MARK_SETTLE_MS;
pub use outputs::{render_tree, RecipeOutputs};
pub use rebuild::{NotReferenced, RebuildSummary, RebuiltVersion, SealedRow};

/// The invocation a batch arrived in.
#[derive(Debug, Clone, Default)]
pub struct Invocation {
    /// Lambda's request id, or any id of the caller's; part of each owner token.
    pub request_id: String,
    /// The invocation deadline in epoch milliseconds, inside Lambda.
    pub deadline_ms: Option<u64>,
    /// The function's timeout: the time every invocation is given. Lambda
    /// tells it only through each invocation's deadline, so the runtime
    /// measures it as the deadline less the time the invocation arrived.
    /// A job needing more than this to start can never run
    /// ([`StartCheck::Never`]). `None`: unknown (outside Lambda, or a test
    /// that sets a short deadline to stand for time already spent).
    pub timeout_ms: Option<u64>,
}

/// The longest a Lambda invocation can last.
pub const LAMBDA_MAX_TIMEOUT: Duration = Duration::from_secs(900);

/// Lambda may retry a function's init inside its first invocation, taking
/// up to 10 s of that invocation's time: a timeout measured then is that
/// much short, so a job is judged never to fit only past this slack.
pub const TIMEOUT_SLACK_MS: u64 = 10_000;

/// Whether a job may start in this invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StartCheck {
    Now,
    /// Not in the time left here; a fresh invocation has the time.
    Later(String),
    /// Not in any invocation of this function: the job needs more than
    /// its timeout ([`Invocation::timeout_ms`]).
    Never(String),
}

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("configuration error: {0}")]
    Config(#[from] ConfigError),
    #[error("the claim table (MEDIAONCE_TABLE) is not usable: {0}")]
    Table(LedgerError),
    #[error(
        "the references table (MEDIAONCE_REFS_TABLE, by default <MEDIAONCE_TABLE>-refs) \
         is not usable: {0}"
    )]
    RefsTable(LedgerError),
}

/// Everything a batch needs: configuration (recipes bound to their steps)
/// and clients.
#[derive(Debug)]
pub struct App {
    pub config: Config,
    pub ledger: Ledger,
    pub store: ObjectStore,
    pub queue: Queue,
    /// Where completion events go (`MEDIAONCE_EVENT_BUS`); `None`: none.
    pub bus: Option<Bus>,
    /// Step Functions, where a split runs (`MEDIAONCE_SPLIT_MACHINE_ARN`
    /// names the state machine); `None`: no split runs there.
    pub executions: Option<Arc<dyn ExecutionClient>>,
    clock: Arc<dyn Clock>,
    /// Where inputs read whole are kept as files (`/tmp` in Lambda).
    scratch: PathBuf,
    /// The owner tokens' and the busy jitter's randomness: seedable, so that
    /// a run (a test, the chaos soak, a simulation) can be repeated.
    rng: Mutex<fastrand::Rng>,
    /// Where each batch's EMF metrics are written (when the configuration
    /// has them on): stderr unless told otherwise, stdout in Lambda.
    metrics_out: MetricsOut,
    /// The longest timeout measured in this process's invocations, and
    /// how many it had ([`App::start_check`]).
    timeouts: TimeoutsSeen,
}

/// The function's timeout as this process's invocations measured it: the
/// longest, and how many there were. One measurement may be short (a
/// retried init inside the invocation); the longest of several is the
/// timeout within the milliseconds an invocation takes to reach the
/// handler.
#[derive(Debug, Default)]
struct TimeoutsSeen {
    longest_ms: std::sync::atomic::AtomicU64,
    invocations: std::sync::atomic::AtomicU64,
}

/// Where a batch's EMF documents go, one raw JSON line each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsOut {
    /// Lambda's log stream, where CloudWatch extracts them.
    Stdout,
    /// Beside the logs of a command whose stdout is its answer.
    Stderr,
}

impl App {
    pub fn new(config: Config, ledger: Ledger, store: ObjectStore, queue: Queue) -> Self {
        App {
            config,
            ledger,
            store,
            queue,
            bus: None,
            executions: None,
            clock: Arc::new(SystemClock),
            scratch: std::env::temp_dir(),
            rng: Mutex::new(fastrand::Rng::new()),
            metrics_out: MetricsOut::Stderr,
            timeouts: TimeoutsSeen::default(),
        }
    }

    /// Counts an invocation and its measured timeout.
    fn invoked(&self, invocation: &Invocation) {
        use std::sync::atomic::Ordering;
        if let Some(timeout) = invocation.timeout_ms {
            self.timeouts.longest_ms.fetch_max(timeout, Ordering::Relaxed);
            self.timeouts.invocations.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The same, publishing completion events on `bus` (to the bus the
    /// configuration names).
    pub fn with_bus(mut self, bus: Bus) -> Self {
        self.bus = Some(bus);
        self
    }

    /// The same, running splits as executions of the configuration's
    /// state machine on `executions`.
    pub fn with_executions(mut self, executions: Arc<dyn ExecutionClient>) -> Self {
        self.executions = Some(executions);
        self
    }

    /// The state machine and its client, when splits run on Step
    /// Functions.
    pub(crate) fn split_engine(&self) -> Option<(&str, &dyn ExecutionClient)> {
        let machine = self.config.split_machine_arn.as_deref()?;
        Some((machine, self.executions.as_deref()?))
    }

    /// Writes the batches' metrics to `out`.
    pub fn with_metrics_out(mut self, out: MetricsOut) -> Self {
        self.metrics_out = out;
        self
    }

    /// The clients' counts so far, for a batch's usage.
    pub(crate) fn usage_so_far(&self) -> BatchUsage {
        BatchUsage {
            input_bytes_read: self.store.bytes_read(),
            output_bytes_written: self.store.bytes_written(),
            dynamodb_calls: self.ledger.calls(),
            dynamodb_retries: {
                let (conflicts, throttles) = self.ledger.retries();
                conflicts + throttles
            },
            events_published: self.bus.as_ref().map_or(0, |bus| bus.counts().0),
            event_publish_failures: self.bus.as_ref().map_or(0, |bus| bus.counts().1),
        }
    }

    /// Writes `report`'s EMF documents, one raw JSON line each (CloudWatch
    /// extracts metrics only from a log event whose top level holds `_aws`,
    /// so never inside a tracing event).
    pub(crate) fn write_metrics(&self, report: &BatchReport) {
        let Some(namespace) = &self.config.metrics_namespace else {
            return;
        };
        let documents = crate::metrics::batch_documents(
            namespace,
            report,
            crate::metrics::take_cold_start(),
            self.now_ms(),
        );
        self.write_documents(&documents);
    }

    /// Writes a collection sweep's EMF document (`metrics::sweep_document`).
    pub fn write_sweep_metrics(&self, sweep: &collect::Sweep) {
        let Some(namespace) = &self.config.metrics_namespace else {
            return;
        };
        let document = crate::metrics::sweep_document(
            namespace,
            sweep.collected.len(),
            sweep.failures.len(),
            self.now_ms(),
        );
        self.write_documents(&[document]);
    }

    fn write_documents(&self, documents: &[serde_json::Value]) {
        let lines: String = documents
            .iter()
            .map(|document| format!("{document}\n"))
            .collect();
        // One write of whole lines, so a concurrent log line cannot split one.
        match self.metrics_out {
            MetricsOut::Stdout => print!("{lines}"),
            MetricsOut::Stderr => eprint!("{lines}"),
        }
    }

    /// The same, reading the time from `clock`.
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The same, keeping input files in `dir` (default: the system's
    /// temporary directory, `TMPDIR` if set).
    pub fn with_scratch(mut self, dir: impl Into<PathBuf>) -> Self {
        self.scratch = dir.into();
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

    /// The record's shared copy of `head`'s bytes, for jobs that read them
    /// as `uses` (kept in memory or in scratch only when one reads them
    /// whole: [`crate::identity::keep`]).
    fn object_bytes(
        &self,
        head: crate::fingerprint::ObjectHead,
        uses: &[crate::step::InputUse],
    ) -> Arc<crate::step::ObjectBytes> {
        let keep = crate::identity::keep(uses, head.size);
        Arc::new(crate::step::ObjectBytes::new(
            self.store.clone(),
            head,
            keep,
            &self.scratch,
        ))
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

    /// The first recipe whose jobs need more than `timeout` to start, as
    /// an error naming it: no invocation that long can run them. Lambda's
    /// invocations last at most [`LAMBDA_MAX_TIMEOUT`].
    pub fn recipe_beyond(&self, timeout: Duration) -> Option<String> {
        self.config.recipes.iter().enumerate().find_map(|(index, rule)| {
            let margin = self.start_margin(rule);
            (margin > timeout).then(|| {
                format!(
                    "recipe {index} ({}) needs {} s before the invocation deadline to start a \
                     job (MEDIAONCE_DEADLINE_MARGIN_SECS and its step's need), and an \
                     invocation lasts at most {} s: no invocation could run it",
                    rule.name,
                    margin.as_secs(),
                    timeout.as_secs()
                )
            })
        })
    }

    /// Whether a job needing `margin` may start now, in a later
    /// invocation, or never (it needs the function's whole timeout or
    /// more). After one invocation of this process, the timeout it
    /// measured is trusted only with [`TIMEOUT_SLACK_MS`] to spare (a
    /// retried init may have taken part of it); after several, their
    /// longest is the timeout, and a job needing at least that much can
    /// never start (every invocation has less left when the job's turn
    /// comes), so none is deferred for ever.
    fn start_check(&self, invocation: &Invocation, margin: Duration) -> StartCheck {
        use std::sync::atomic::Ordering;
        let Some(deadline) = invocation.deadline_ms else {
            return StartCheck::Now;
        };
        let margin = u64::try_from(margin.as_millis()).unwrap_or(u64::MAX);
        if let Some(measured) = invocation.timeout_ms {
            let longest = self.timeouts.longest_ms.load(Ordering::Relaxed).max(measured);
            let never = if self.timeouts.invocations.load(Ordering::Relaxed) > 1 {
                margin >= longest
            } else {
                margin > longest.saturating_add(TIMEOUT_SLACK_MS)
            };
            let timeout = longest;
            if never {
                return StartCheck::Never(format!(
                    "not started, and no invocation can start it: it needs {margin} ms before the \
                     deadline (MEDIAONCE_DEADLINE_MARGIN_SECS and its step's need) and the \
                     function's invocations last {timeout} ms: raise the function's timeout or \
                     lower the recipe's need"
                ));
            }
        }
        let remaining = deadline.saturating_sub(self.now_ms());
        if remaining < margin {
            return StartCheck::Later(format!(
                "not started: {remaining} ms left before the invocation deadline, {margin} ms needed"
            ));
        }
        StartCheck::Now
    }

    /// Reads the configuration (binding its recipes to `steps`) and builds
    /// the AWS clients, then checks the table, so that a misconfiguration
    /// fails at start-up with its name.
    pub async fn from_env(steps: StepRegistry) -> Result<Self, StartupError> {
        App::from_config(Config::from_env(&steps)?).await
    }

    /// The AWS clients for `config`, both tables checked.
    pub async fn from_config(config: Config) -> Result<Self, StartupError> {
        let sdk = crate::aws::load_sdk_config().await;
        let mut app = App::new(
            config.clone(),
            Ledger::dynamodb_with_refs(
                crate::aws::dynamodb_client(&sdk),
                config.table.clone(),
                config.refs_table.clone(),
            ),
            ObjectStore::s3(
                crate::aws::s3_client(&sdk),
                config.expected_bucket_owner.clone(),
            ),
            Queue::sqs(crate::aws::sqs_client(&sdk)),
        );
        if config.event_bus.is_some() {
            app = app.with_bus(Bus::eventbridge(crate::aws::eventbridge_client(&sdk)));
        }
        if config.split_machine_arn.is_some() {
            let client = aws_sdk_sfn::Client::new(&sdk);
            app = app.with_executions(Arc::new(crate::executions::SfnExecutions::new(client)));
        }
        app.ledger.check_table().await.map_err(StartupError::Table)?;
        app.ledger
            .check_refs_table()
            .await
            .map_err(StartupError::RefsTable)?;
        Ok(app)
    }
}

/// Locks a mutex, even one a panicking task held: the data are reports,
/// whole or absent.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests;
