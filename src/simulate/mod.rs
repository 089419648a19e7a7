//! `mediaonce simulate`: a month of uploads played through the real handler
//! ([`handle_batch`]: records, identity, claims, steps' finish, references)
//! on the in-memory clients, with a virtual clock and a step that only
//! counts its runs. Beside it, on the same deliveries, what keying by
//! message id (a per-message idempotency utility, as Powertools' is) would
//! have run. README ("The month, simulated") shows a run.
//!
//! Time is virtual: every delivery has a time, the clock jumps to it, and
//! leases, visibility timeouts and busy delays are arithmetic on it. Two
//! invocations run at once only to model an SQS redelivery while the first
//! attempt still runs: they interleave on one thread at the step's yields.

mod burst;
pub mod clients;
mod long;
pub(crate) use long::write_one_segment;
pub(crate) mod machine;
mod traffic;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use serde_json::{Map, Value};

use crate::config::Config;
use crate::handler::{handle_batch, App, Invocation, Outcome};
use crate::lease::Clock;
use crate::ledger::Ledger;
use crate::queue::{Queue, RecordingQueue};
use crate::step::{InputUse, JobOutputs, Step, StepContext, StepError};
use crate::steps::StepRegistry;
use crate::store::ObjectStore;
pub use burst::{render_burst, simulate_burst, BurstOptions, BurstReport};
use clients::{SimObjects, SimTable, TableUse};
pub use traffic::{Delivery, Traffic};

/// The simulation's knobs; defaults are the reference design's month.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SimOptions {
    pub uploads: u64,
    /// Share of uploads byte-identical to an earlier one.
    pub identical: f64,
    /// Share of notifications S3 sends twice (a new message id).
    pub s3_duplicates: f64,
    /// Share of messages SQS delivers again while the first attempt runs.
    pub redeliveries: f64,
    /// Share of batches Lambda sends again, whole (new request id).
    pub lambda_retries: f64,
    /// Share of uploads whose user asks for them again (a new message).
    pub reprocess_clicks: f64,
    /// Share of step runs whose worker dies before finishing.
    pub crashes: f64,
    pub recipes: usize,
    /// A video-like pipeline instead of `recipes` flat ones: probe, hls,
    /// poster, and thumbnails of the poster (chained to it).
    pub chained: bool,
    /// Share of contents that are long videos: with it, an `hls-package`
    /// recipe too, whose long inputs split into chunk jobs joined by the
    /// last (0: none).
    pub long_videos: f64,
    pub seed: u64,
    pub gb_seconds_per_run: f64,
    pub price: Prices,
}

/// List prices (USD), as flags.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Prices {
    pub lambda_gb_second: f64,
    pub dynamodb_write_million: f64,
    pub dynamodb_read_million: f64,
    pub s3_put_thousand: f64,
    pub s3_get_thousand: f64,
}

impl Default for Prices {
    /// us-east-1, arm64, on demand.
    fn default() -> Self {
        Prices {
            lambda_gb_second: 0.000_013_333_4,
            dynamodb_write_million: 0.625,
            dynamodb_read_million: 0.125,
            s3_put_thousand: 0.005,
            s3_get_thousand: 0.000_4,
        }
    }
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            uploads: 100_000,
            identical: 0.09,
            s3_duplicates: 0.03,
            redeliveries: 0.02,
            lambda_retries: 0.01,
            reprocess_clicks: 0.05,
            crashes: 0.002,
            recipes: 1,
            chained: false,
            long_videos: 0.0,
            seed: 1,
            gb_seconds_per_run: 50.0,
            price: Prices::default(),
        }
    }
}

/// What the month came to.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SimReport {
    pub uploads: u64,
    /// Messages handed to the handler (first deliveries and every return).
    pub deliveries: u64,
    pub invocations: u64,
    pub runs_by_message_id: u64,
    pub runs_by_content: u64,
    /// Jobs that ran to their finish, by recipe: each unique job once.
    pub runs_by_recipe: BTreeMap<String, u64>,
    pub unique_jobs: u64,
    pub runs_cut_short_by_crashes: u64,
    /// Long videos' jobs split into chunk jobs, those joined (done, their
    /// split ended) by the month's end, and the chunks' runs.
    pub split_jobs: u64,
    pub split_jobs_joined: u64,
    pub chunk_runs: u64,
    /// The state machine's executions, tasks, retries and transitions.
    pub executions: machine::MachineCounts,
    pub dynamodb_calls: u64,
    pub dynamodb: TableUse,
    pub s3_requests: BTreeMap<&'static str, u64>,
    pub outcomes: BTreeMap<&'static str, u64>,
    pub bill_by_message_id_usd: f64,
    pub bill_by_content_usd: f64,
    pub options: SimOptions,
}

/// Whether a run's worker dies before its finish: for a share of runs, the
/// job is named to the table (whose finish then fails, as a dead worker's
/// never comes) and counted.
#[derive(Clone)]
struct CrashDice {
    share: f64,
    rng: Arc<Mutex<fastrand::Rng>>,
    crashes: Arc<AtomicU64>,
    crash_before_finish: Arc<Mutex<HashSet<String>>>,
}

impl CrashDice {
    fn roll(&self, job_key: &str) {
        let crash = self.rng.lock().unwrap_or_else(|e| e.into_inner()).f64() < self.share;
        if crash {
            self.crashes.fetch_add(1, Ordering::Relaxed);
            self.crash_before_finish
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(job_key.to_string());
        }
    }
}

/// The step the simulation runs: counts its runs, and for a share of them
/// makes its worker die before the finish. With `"writes": name` in its
/// params it writes one small output file of that name, its bytes the job
/// key's (the same content gives the same file), for a chained recipe to
/// read.
struct CountedRun {
    runs: Arc<AtomicU64>,
    crash: CrashDice,
}

#[async_trait::async_trait]
impl Step for CountedRun {
    /// The output file it writes, if any.
    type Params = Option<String>;

    fn name(&self) -> &'static str {
        "simulated"
    }

    fn params(&self, params: &Map<String, Value>) -> Result<Option<String>, String> {
        match params.get("writes") {
            None => Ok(None),
            Some(Value::String(name)) => Ok(Some(name.clone())),
            Some(other) => Err(format!("writes must be a file name, got {other}")),
        }
    }

    fn input_use(&self, _params: &Option<String>) -> InputUse {
        InputUse::Ranges
    }

    async fn run(
        &self,
        writes: &Option<String>,
        context: &StepContext<'_>,
        outputs: &mut JobOutputs,
    ) -> Result<(), StepError> {
        self.runs.fetch_add(1, Ordering::Relaxed);
        // A run takes time: another invocation may interleave here.
        tokio::task::yield_now().await;
        self.crash.roll(context.job_key);
        if let Some(name) = writes {
            let bytes = context.job_key.as_bytes().to_vec();
            outputs
                .put_bytes(name, "application/octet-stream", bytes)
                .await?;
        }
        Ok(())
    }
}

/// The virtual clock.
#[derive(Debug, Clone, Default)]
struct VirtualClock(Arc<AtomicU64>);

impl Clock for VirtualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

const BUCKET: &str = "uploads";
const QUEUE_ARN: &str = "arn:aws:sqs:us-east-1:123456789012:mediaonce-jobs";
/// The template's default: a 120 s function, its queue's visibility 6×.
const FUNCTION_TIMEOUT_MS: u64 = 120_000;
const VISIBILITY_MS: u64 = 720_000;
const BATCH_SIZE: usize = 10;
/// The event source mapping's batching window.
const BATCH_WINDOW_MS: u64 = 1_000;
/// The month starts here (epoch ms), so that leases are plausible times.
const START_MS: u64 = 1_780_000_000_000;

/// Per message id, what a per-message idempotency utility has recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ById {
    /// A run of it is in progress (the record's expiry: the function's
    /// timeout); a delivery meanwhile is rejected and comes back.
    InProgress {
        until_ms: u64,
    },
    Done,
}

/// The recipes of the month: `recipes` flat ones (`recipe-0`, ...), or the
/// video-like pipeline, every recipe a [`CountedRun`] of its own params.
fn sim_recipes(options: &SimOptions) -> Vec<Value> {
    if options.chained {
        return serde_json::json!([
            {"name": "probe", "step": "simulated", "version": 1, "params": {"rendition": "probe"}},
            {"name": "hls", "step": "simulated", "version": 1, "params": {"rendition": "hls"}},
            {"name": "poster", "step": "simulated", "version": 1,
             "params": {"rendition": "poster", "writes": "poster.jpg"}},
            {"name": "poster-thumbs", "step": "simulated", "version": 1,
             "params": {"rendition": "poster-thumbs"},
             "input": {"recipe": "poster", "file": "poster.jpg"}}
        ])
        .as_array()
        .cloned()
        .unwrap_or_default();
    }
    (0..options.recipes.max(1))
        .map(|n| {
            serde_json::json!({"name": format!("recipe-{n}"), "step": "simulated", "version": 1,
                               "params": {"rendition": n}})
        })
        .collect()
}

/// Plays the month.
pub async fn simulate(options: &SimOptions) -> Result<SimReport, String> {
    let table = SimTable::new();
    let objects = SimObjects::new();
    // A busy message's ChangeMessageVisibility, read back by receipt handle.
    let queue = Arc::new(RecordingQueue::default());
    let (table_use, s3_requests, uploaded) = (
        table.usage.clone(),
        objects.requests.clone(),
        objects.inner.clone(),
    );
    let clock = VirtualClock::default();
    clock.0.store(START_MS, Ordering::Relaxed);
    let runs = Arc::new(AtomicU64::new(0));
    let crashes = Arc::new(AtomicU64::new(0));
    let mut steps = StepRegistry::builtin();
    let crash = CrashDice {
        share: options.crashes,
        rng: Arc::new(Mutex::new(fastrand::Rng::with_seed(options.seed ^ 0x5eed))),
        crashes: crashes.clone(),
        crash_before_finish: table.crash_before_finish.clone(),
    };
    steps.register(CountedRun {
        runs: runs.clone(),
        crash: crash.clone(),
    });
    let videos = Arc::new(long::LongVideos::default());
    let mut recipes = sim_recipes(options);
    if options.long_videos > 0.0 {
        steps.register(long::SimPackage {
            share: options.long_videos,
            videos: videos.clone(),
            crash: crash.clone(),
        });
        steps.register(long::SimChunk {
            videos: videos.clone(),
            crash,
        });
        recipes.push(long::recipe());
    }
    let recipe_count = recipes.len() as u64;
    let mut vars: HashMap<&str, String> = HashMap::from([
        ("MEDIAONCE_TABLE", "simulated".to_string()),
        ("MEDIAONCE_OUTPUT_BUCKET", "outputs".to_string()),
        ("MEDIAONCE_RECIPES", Value::Array(recipes).to_string()),
        ("MEDIAONCE_METRICS", "off".to_string()),
        ("MEDIAONCE_CONCURRENCY", BATCH_SIZE.to_string()),
    ]);
    // Long videos' splits run as executions of the modelled state machine.
    let executions = Arc::new(crate::executions::InMemoryExecutions::default());
    let mut machine = machine::SimMachine::new(executions.clone());
    if options.long_videos > 0.0 {
        vars.insert(
            "MEDIAONCE_SPLIT_MACHINE_ARN",
            machine::MACHINE_ARN.to_string(),
        );
    }
    let config =
        Config::from_lookup(|name| vars.get(name).cloned(), &steps).map_err(|e| e.to_string())?;
    let app = Arc::new(
        App::new(
            config,
            Ledger::new(table),
            ObjectStore::new(objects),
            Queue::new(queue.clone()),
        )
        .with_clock(clock.clone())
        .with_seed(options.seed)
        .with_executions(executions),
    );

    let mut traffic = Traffic::new(options, START_MS);
    // Deliveries by time: (at, order) → the delivery.
    let mut due: BinaryHeap<Reverse<(u64, u64)>> = BinaryHeap::new();
    let mut pending: HashMap<u64, Delivery> = HashMap::new();
    let mut order = 0u64;
    let mut schedule = |due: &mut BinaryHeap<Reverse<(u64, u64)>>,
                        pending: &mut HashMap<u64, Delivery>,
                        delivery: Delivery| {
        order += 1;
        due.push(Reverse((delivery.at_ms, order)));
        pending.insert(order, delivery);
    };
    let mut rng = fastrand::Rng::with_seed(options.seed ^ 0xbad5eed);
    let mut by_id: HashMap<String, ById> = HashMap::new();
    let mut report = SimReport {
        uploads: options.uploads,
        deliveries: 0,
        invocations: 0,
        runs_by_message_id: 0,
        runs_by_content: 0,
        runs_by_recipe: BTreeMap::new(),
        unique_jobs: 0,
        runs_cut_short_by_crashes: 0,
        split_jobs: 0,
        split_jobs_joined: 0,
        chunk_runs: 0,
        executions: machine::MachineCounts::default(),
        dynamodb_calls: 0,
        dynamodb: TableUse::default(),
        s3_requests: BTreeMap::new(),
        outcomes: BTreeMap::new(),
        bill_by_message_id_usd: 0.0,
        bill_by_content_usd: 0.0,
        options: options.clone(),
    };
    let mut receipts = 0u64;
    let mut sent_messages = 0u64;

    loop {
        // Uploads up to the next delivery's time join the heap first.
        let next_due = due.peek().map(|Reverse((at, _))| *at);
        if let Some(upload) = traffic.next_before(next_due, &uploaded) {
            for delivery in upload {
                schedule(&mut due, &mut pending, delivery);
            }
            continue;
        }
        let Some(Reverse((at, first))) = due.pop() else {
            break;
        };
        clock.0.store(at.max(clock.now_ms()), Ordering::Relaxed);
        let mut batch = vec![pending.remove(&first).expect("scheduled")];
        while batch.len() < BATCH_SIZE {
            match due.peek() {
                Some(Reverse((next, _))) if *next <= at + BATCH_WINDOW_MS => {
                    let Reverse((_, id)) = due.pop().expect("peeked");
                    batch.push(pending.remove(&id).expect("scheduled"));
                }
                _ => break,
            }
        }
        let now = clock.now_ms();
        // SQS delivers some again while the first attempt runs.
        let again: Vec<Delivery> = batch
            .iter()
            .filter(|_| rng.f64() < options.redeliveries)
            .cloned()
            .collect();
        let mut invocations = vec![batch];
        if !again.is_empty() {
            invocations.push(again);
        }
        // By message id: the first invocation's messages start; the second's
        // find them in progress.
        for (n, deliveries) in invocations.iter().enumerate() {
            for delivery in deliveries {
                let state = by_id.get(&delivery.message_id).copied();
                match state {
                    Some(ById::Done) => {}
                    Some(ById::InProgress { until_ms }) if until_ms > now || n > 0 => {}
                    _ => {
                        report.runs_by_message_id += recipe_count;
                        by_id.insert(
                            delivery.message_id.clone(),
                            ById::InProgress {
                                until_ms: now + FUNCTION_TIMEOUT_MS,
                            },
                        );
                    }
                }
            }
        }
        let crashed_before = crashes.load(Ordering::Relaxed);
        let handled = futures::future::join_all(invocations.iter().map(|deliveries| {
            let messages: Vec<SqsMessage> = deliveries
                .iter()
                .map(|d| {
                    receipts += 1;
                    d.message(receipts, QUEUE_ARN)
                })
                .collect();
            let mut event = SqsEvent::default();
            event.records = messages.clone();
            report.invocations += 1;
            let invocation = Invocation {
                request_id: format!("sim-{}", report.invocations),
                deadline_ms: Some(now + FUNCTION_TIMEOUT_MS),
                timeout_ms: Some(FUNCTION_TIMEOUT_MS),
            };
            let app = app.clone();
            async move { (messages, handle_batch(app, event, invocation).await) }
        }))
        .await;
        // A worker that died takes its whole invocation with it: nothing of
        // its batch is acknowledged. (Both invocations die together: they
        // share the crash count; the rare overlap is a conservative model.)
        let crashed = crashes.load(Ordering::Relaxed) > crashed_before;
        for ((messages, batch_report), deliveries) in handled.iter().zip(&invocations) {
            report.deliveries += messages.len() as u64;
            for job in batch_report.jobs() {
                *report.outcomes.entry(job.outcome.as_str()).or_default() += 1;
                if job.outcome == Outcome::Ran {
                    *report.runs_by_recipe.entry(job.recipe.clone()).or_default() += 1;
                }
            }
            let failed: HashSet<String> = batch_report
                .response()
                .batch_item_failures
                .into_iter()
                .map(|f| f.item_identifier)
                .collect();
            for (message, delivery) in messages.iter().zip(deliveries) {
                let id = delivery.message_id.as_str();
                let comes_back = crashed || failed.contains(id);
                if !comes_back {
                    if by_id.get(id).is_some_and(|s| *s != ById::Done) {
                        by_id.insert(id.to_string(), ById::Done);
                    }
                    continue;
                }
                let delay_ms = queue
                    .delay_of(message.receipt_handle.as_deref().unwrap_or_default())
                    .filter(|_| !crashed)
                    .map_or(VISIBILITY_MS, |seconds| seconds.max(0) as u64 * 1_000);
                let mut back = delivery.clone();
                back.at_ms = now + delay_ms;
                schedule(&mut due, &mut pending, back);
            }
        }
        // What the handler sent (chunk messages, hand-ons) is delivered a
        // batching window later.
        for (_, body) in queue.take_sent() {
            sent_messages += 1;
            let id = format!("sent-{sent_messages}");
            schedule(
                &mut due,
                &mut pending,
                Delivery::sent(now + BATCH_WINDOW_MS, id, &body),
            );
        }
        // The state machine moves its executions on: its task messages
        // (a retry's after its backoff) are delivered like any other.
        for (at, body) in machine.step(clock.now_ms()) {
            sent_messages += 1;
            let id = format!("sent-{sent_messages}");
            let at = at.max(now) + BATCH_WINDOW_MS;
            schedule(&mut due, &mut pending, Delivery::sent(at, id, &body));
        }
        // Lambda sends a whole batch again now and then (a new invocation).
        if rng.f64() < options.lambda_retries {
            for delivery in &invocations[0] {
                let mut again = delivery.clone();
                again.at_ms = now + BATCH_WINDOW_MS;
                schedule(&mut due, &mut pending, again);
            }
        }
    }

    report.chunk_runs = videos.chunk_runs.load(Ordering::Relaxed);
    report.executions = machine.counts.clone();
    report.runs_by_content =
        runs.load(Ordering::Relaxed) + videos.runs.load(Ordering::Relaxed) + report.chunk_runs;
    report.runs_cut_short_by_crashes = crashes.load(Ordering::Relaxed);
    let split: Vec<String> = videos
        .split
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .cloned()
        .collect();
    report.split_jobs = split.len() as u64;
    // A long video's job runs as its chunks: one run each, none of its own.
    report.unique_jobs =
        traffic.unique_contents() * recipe_count + report.split_jobs * u64::from(long::CHUNKS - 1);
    report.dynamodb = table_use.lock().unwrap_or_else(|e| e.into_inner()).clone();
    report.dynamodb_calls = report.dynamodb.total_calls();
    report.s3_requests = s3_requests
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    for job_key in &split {
        let row = app.ledger.get(job_key).await.map_err(|e| e.to_string())?;
        let joined = row.is_some_and(|r| r.status == crate::ledger::JobStatus::Done);
        report.split_jobs_joined += u64::from(joined);
    }
    // By message id, crashed runs ran again too (the same crashes).
    report.runs_by_message_id += report.runs_cut_short_by_crashes;
    let price = &options.price;
    let requests = |name: &str| report.s3_requests.get(name).copied().unwrap_or(0) as f64;
    let overhead = report.dynamodb.write_units / 1e6 * price.dynamodb_write_million
        + report.dynamodb.read_units / 1e6 * price.dynamodb_read_million
        + requests("PUT") / 1e3 * price.s3_put_thousand
        + (requests("GET") + requests("HEAD")) / 1e3 * price.s3_get_thousand;
    let compute = |runs: u64| runs as f64 * options.gb_seconds_per_run * price.lambda_gb_second;
    report.bill_by_content_usd = compute(report.runs_by_content) + overhead;
    // A per-message idempotency utility writes a record per delivery (a
    // conditional PutItem) and completes it per run (an UpdateItem).
    let by_id_writes = (report.deliveries + report.runs_by_message_id) as f64;
    report.bill_by_message_id_usd =
        compute(report.runs_by_message_id) + by_id_writes / 1e6 * price.dynamodb_write_million;
    Ok(report)
}

/// The table a person reads.
pub fn render(report: &SimReport) -> String {
    let o = &report.options;
    let mut text = String::new();
    text.push_str(&format!(
        "mediaonce simulate: {} uploads, {:.0}% identical, {:.0}% S3 duplicates, {:.0}% redelivered while running, \
         {:.0}% of batches retried by Lambda, {:.0}% reprocess clicks, {:.1}% of runs crashed; {}; seed {}\n\n",
        o.uploads,
        o.identical * 100.0,
        o.s3_duplicates * 100.0,
        o.redeliveries * 100.0,
        o.lambda_retries * 100.0,
        o.reprocess_clicks * 100.0,
        o.crashes * 100.0,
        match (o.chained, o.long_videos > 0.0) {
            (true, false) => "a chained pipeline (probe, hls, poster, poster-thumbs)".to_string(),
            (true, true) => format!(
                "a chained pipeline and hls-long ({:.0}% long videos, {} chunks each)",
                o.long_videos * 100.0,
                long::CHUNKS
            ),
            (false, false) => format!("{} recipe(s)", o.recipes),
            (false, true) => format!(
                "{} recipe(s) and hls-long ({:.0}% long videos, {} chunks each)",
                o.recipes,
                o.long_videos * 100.0,
                long::CHUNKS
            ),
        },
        o.seed
    ));
    let row = |name: &str, value: String| format!("  {name:<44} {value:>14}\n");
    text.push_str(&row(
        "deliveries (messages handed to the handler)",
        report.deliveries.to_string(),
    ));
    text.push_str(&row("invocations", report.invocations.to_string()));
    text.push_str(&row(
        "runs keyed by message id",
        report.runs_by_message_id.to_string(),
    ));
    text.push_str(&row(
        "runs keyed by content (mediaonce)",
        report.runs_by_content.to_string(),
    ));
    text.push_str(&row(
        "  unique (content, recipe) jobs",
        report.unique_jobs.to_string(),
    ));
    text.push_str(&row(
        "  runs cut short by crashes",
        report.runs_cut_short_by_crashes.to_string(),
    ));
    if o.long_videos > 0.0 {
        text.push_str(&row(
            "  long videos split / joined",
            format!("{} / {}", report.split_jobs, report.split_jobs_joined),
        ));
        text.push_str(&row("  chunk runs", report.chunk_runs.to_string()));
        let e = &report.executions;
        text.push_str(&row(
            "  executions started / succeeded / failed",
            format!(
                "{} / {} / {}",
                e.executions_started, e.executions_succeeded, e.executions_failed
            ),
        ));
        text.push_str(&row(
            "  chunk tasks / retries / state transitions",
            format!(
                "{} / {} / {}",
                e.chunk_tasks, e.task_retries, e.state_transitions
            ),
        ));
    }
    for (recipe, n) in &report.runs_by_recipe {
        text.push_str(&row(
            &format!("  ran to the finish: {recipe}"),
            n.to_string(),
        ));
    }
    text.push_str(&row("DynamoDB calls", report.dynamodb_calls.to_string()));
    for (call, n) in &report.dynamodb.calls {
        text.push_str(&row(&format!("  {call}"), n.to_string()));
    }
    text.push_str(&row(
        "DynamoDB write / read units",
        format!(
            "{:.0} / {:.0}",
            report.dynamodb.write_units, report.dynamodb.read_units
        ),
    ));
    for (request, n) in &report.s3_requests {
        text.push_str(&row(&format!("S3 {request}"), n.to_string()));
    }
    for (outcome, n) in &report.outcomes {
        text.push_str(&row(&format!("jobs {outcome}"), n.to_string()));
    }
    text.push_str(&row(
        "bill keyed by message id (USD)",
        format!("{:.2}", report.bill_by_message_id_usd),
    ));
    text.push_str(&row(
        "bill keyed by content (USD)",
        format!("{:.2}", report.bill_by_content_usd),
    ));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A month with every kind of duplicate and crash, often.
    fn chaotic() -> SimOptions {
        SimOptions {
            identical: 0.2,
            s3_duplicates: 0.1,
            redeliveries: 0.1,
            lambda_retries: 0.05,
            reprocess_clicks: 0.1,
            crashes: 0.02,
            ..SimOptions::default()
        }
    }

    /// Plays `options`, and checks that every job ran once, plus the runs
    /// crashes cut short (some were).
    async fn every_job_once(options: &SimOptions) -> SimReport {
        let report = simulate(options).await.unwrap();
        assert!(report.runs_cut_short_by_crashes > 0, "{report:?}");
        assert_eq!(
            report.runs_by_content,
            report.unique_jobs + report.runs_cut_short_by_crashes,
            "{report:?}"
        );
        report
    }

    #[tokio::test]
    async fn every_job_runs_once_plus_the_runs_crashes_cut_short() {
        let options = SimOptions {
            uploads: 3_000,
            recipes: 2,
            seed: 7,
            ..chaotic()
        };
        let report = every_job_once(&options).await;
        // Two recipes per content: every unique content ran both.
        assert_eq!(report.unique_jobs % 2, 0);
        assert!(report.runs_by_message_id > report.runs_by_content + 1_000);
        assert!(report.outcomes["busy"] > 0 && report.outcomes["reused"] > 0);
        assert_eq!(
            report.dynamodb.calls["UpdateItem (takeover)"],
            report.runs_cut_short_by_crashes
        );
        assert_eq!(
            report.runs_by_recipe.values().sum::<u64>(),
            report.unique_jobs
        );
        // The same seed, the same month.
        let again = simulate(&options).await.unwrap();
        assert_eq!(
            (
                again.runs_by_content,
                again.runs_by_message_id,
                again.deliveries
            ),
            (
                report.runs_by_content,
                report.runs_by_message_id,
                report.deliveries
            )
        );
    }

    #[tokio::test]
    async fn long_videos_split_run_every_chunk_once_and_are_all_joined() {
        let options = SimOptions {
            uploads: 2_000,
            long_videos: 0.3,
            seed: 5,
            ..chaotic()
        };
        let report = every_job_once(&options).await;
        assert!(report.split_jobs > 100, "{report:?}");
        assert_eq!(report.split_jobs_joined, report.split_jobs, "{report:?}");
        assert!(report.outcomes["waiting"] > 0, "{report:?}");
        // Every chunk ran once (or again after a crash cut it short).
        assert!(report.chunk_runs >= report.split_jobs * u64::from(long::CHUNKS));
        assert!(
            report.chunk_runs
                <= report.split_jobs * u64::from(long::CHUNKS) + report.runs_cut_short_by_crashes
        );
        // Each split is one execution, which joined it; a takeover (its
        // claimant crashed before starting, or its execution closed)
        // starts one more.
        let e = &report.executions;
        assert!(e.executions_started >= report.split_jobs, "{e:?}");
        assert_eq!(e.executions_succeeded, report.split_jobs, "{e:?}");
        assert_eq!(
            e.executions_started,
            e.executions_succeeded + e.executions_failed,
            "every execution ended: {e:?}"
        );
        assert!(
            e.chunk_tasks >= report.split_jobs * u64::from(long::CHUNKS),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn a_chained_pipeline_runs_every_job_once_too() {
        let options = SimOptions {
            uploads: 1_500,
            chained: true,
            seed: 11,
            ..chaotic()
        };
        let report = every_job_once(&options).await;
        // Every recipe, the chained one too, ran each content once.
        let contents = report.unique_jobs / 4;
        let names: Vec<&str> = report.runs_by_recipe.keys().map(String::as_str).collect();
        assert_eq!(names, ["hls", "poster", "poster-thumbs", "probe"]);
        assert!(
            report.runs_by_recipe.values().all(|&n| n == contents),
            "{report:?}"
        );
        assert_eq!(report.outcomes.get("handed-on"), None, "{report:?}");
    }
}
