//! `mediaonce simulate --burst-uploads N`: a popular content (a meme)
//! uploaded N times, at `rate` a second, each to its own key, through the
//! real handler on the in-memory clients, with DynamoDB's contention
//! modelled ([`crate::ledger::contention::ContendedTable`]: transactions
//! hold their items, each item takes at most 1,000 write units a second).
//!
//! Every upload is its own invocation, all in flight at once as SQS and
//! Lambda would run them, on tokio's paused clock: waits (the step's run,
//! transactions, the ledger's backoff, a message's visibility) cost no
//! real time. A message that is not acknowledged comes back after its
//! visibility (or the busy delay the handler asked for), and after the
//! queue's `maxReceiveCount` receives it is dead-lettered.

use std::collections::HashMap;
use std::sync::Arc;

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use serde_json::{Map, Value};

use crate::config::Config;
use crate::handler::{handle_batch, App, Invocation};
use crate::lease::Clock;
use crate::ledger::contention::ContendedTable;
use crate::ledger::memory::InMemoryTable;
use crate::ledger::Ledger;
use crate::queue::{Queue, RecordingQueue};
use crate::references::VersionName;
use crate::step::{InputUse, JobOutputs, Step, StepContext, StepError};
use crate::steps::StepRegistry;
use crate::store::memory::InMemoryObjects;
use crate::store::ObjectStore;

/// The burst's knobs.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BurstOptions {
    pub uploads: u64,
    /// Uploads a second.
    pub rate: u64,
    /// How long the one run of the content's job takes.
    pub run_ms: u64,
    /// How long a transaction holds its items.
    pub transaction_ms: u64,
    pub seed: u64,
}

impl Default for BurstOptions {
    fn default() -> Self {
        BurstOptions {
            uploads: 20_000,
            rate: 2_000,
            run_ms: 2_000,
            transaction_ms: 25,
            seed: 1,
        }
    }
}

/// What the burst came to.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BurstReport {
    pub uploads: u64,
    pub deliveries: u64,
    /// Messages that would reach the DLQ (`maxReceiveCount` receives, none
    /// acknowledged).
    pub dead_lettered: u64,
    /// Contended calls the ledger retried in-process.
    pub conflicts_retried: u64,
    pub throttles_retried: u64,
    /// Calls DynamoDB refused (each retried, or reported).
    pub conflicts: u64,
    pub throttles: u64,
    /// Live versions the job has no reference item for (or items too many).
    pub refs_mismatches: u64,
    /// Live versions whose row does not count the job.
    pub uncounted_versions: u64,
    pub step_runs: u64,
    pub write_units: f64,
    pub write_units_per_upload: f64,
    /// Virtual seconds from the first upload to the last acknowledgement.
    pub seconds_to_drain: f64,
    pub options: BurstOptions,
}

/// The queue's `maxReceiveCount` (the template's).
const MAX_RECEIVES: u32 = 5;
/// The template's default function timeout and its queue's visibility.
const FUNCTION_TIMEOUT_MS: u64 = 120_000;
const VISIBILITY_MS: u64 = 720_000;
const BUCKET: &str = "uploads";
const QUEUE_ARN: &str = "arn:aws:sqs:us-east-1:123456789012:mediaonce-jobs";
const START_MS: u64 = 1_767_225_600_000;

/// The virtual clock: tokio's (paused) time since the burst began.
#[derive(Debug, Clone, Copy)]
struct TokioClock(tokio::time::Instant);

impl Clock for TokioClock {
    fn now_ms(&self) -> u64 {
        START_MS + self.0.elapsed().as_millis() as u64
    }
}

/// The content's one job: waits `run_ms` and counts its runs.
struct TimedRun {
    run_ms: u64,
    runs: Arc<std::sync::atomic::AtomicU64>,
}

#[async_trait::async_trait]
impl Step for TimedRun {
    type Params = ();

    fn name(&self) -> &'static str {
        "simulated"
    }

    fn params(&self, _params: &Map<String, Value>) -> Result<(), String> {
        Ok(())
    }

    fn input_use(&self, _params: &()) -> InputUse {
        InputUse::Ranges
    }

    async fn run(
        &self,
        _params: &(),
        _context: &StepContext<'_>,
        _outputs: &mut JobOutputs,
    ) -> Result<(), StepError> {
        self.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tokio::time::sleep(std::time::Duration::from_millis(self.run_ms)).await;
        Ok(())
    }
}

/// Runs the burst. Call it on a current-thread runtime with time paused
/// (`mediaonce simulate` does): it waits in virtual time.
pub async fn simulate_burst(options: &BurstOptions) -> Result<BurstReport, String> {
    let clock = TokioClock(tokio::time::Instant::now());
    let table = ContendedTable::with_limits(
        InMemoryTable::new("simulated"),
        options.transaction_ms,
        1_000.0,
    );
    let objects = Arc::new(InMemoryObjects::default());
    let queue = Arc::new(RecordingQueue::default());
    let runs = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut steps = StepRegistry::builtin();
    steps.register(TimedRun {
        run_ms: options.run_ms,
        runs: runs.clone(),
    });
    let vars: HashMap<&str, String> = HashMap::from([
        ("MEDIAONCE_TABLE", "simulated".to_string()),
        ("MEDIAONCE_OUTPUT_BUCKET", "outputs".to_string()),
        (
            "MEDIAONCE_RECIPES",
            r#"[{"step":"simulated","version":1,"params":{}}]"#.to_string(),
        ),
        ("MEDIAONCE_METRICS", "off".to_string()),
    ]);
    let config =
        Config::from_lookup(|name| vars.get(name).cloned(), &steps).map_err(|e| e.to_string())?;
    let ledger = Ledger::new(table.clone()).seeded(options.seed);
    let app = Arc::new(
        App::new(
            config,
            ledger.clone(),
            ObjectStore::new(objects.clone()),
            Queue::new(queue.clone()),
        )
        .with_clock(clock)
        .with_seed(options.seed),
    );
    let bytes = b"the meme everyone uploads";
    let mut uploads = Vec::with_capacity(options.uploads as usize);
    for n in 0..options.uploads {
        let key = format!("u/{n}.jpg");
        let etag = objects.insert(BUCKET, &key, bytes, true);
        let body = crate::event::created_notification(
            BUCKET,
            &key,
            None,
            Some(&etag),
            Some(bytes.len() as u64),
        );
        let at = std::time::Duration::from_millis(n * 1_000 / options.rate.max(1));
        let (app, queue) = (app.clone(), queue.clone());
        uploads.push(tokio::spawn(async move {
            tokio::time::sleep(at).await;
            deliver(app, queue, format!("m-{n}"), body).await
        }));
    }
    let mut report = BurstReport {
        uploads: options.uploads,
        deliveries: 0,
        dead_lettered: 0,
        conflicts_retried: 0,
        throttles_retried: 0,
        conflicts: 0,
        throttles: 0,
        refs_mismatches: 0,
        uncounted_versions: 0,
        step_runs: 0,
        write_units: 0.0,
        write_units_per_upload: 0.0,
        seconds_to_drain: 0.0,
        options: options.clone(),
    };
    for upload in uploads {
        let (receives, acknowledged) = upload.await.map_err(|e| e.to_string())?;
        report.deliveries += u64::from(receives);
        report.dead_lettered += u64::from(!acknowledged);
    }
    report.seconds_to_drain = clock.0.elapsed().as_secs_f64();
    (report.conflicts_retried, report.throttles_retried) = ledger.retries();
    let refused = table.refusals();
    (report.conflicts, report.throttles) = (refused.conflicts, refused.throttles);
    report.write_units = table.write_units();
    report.write_units_per_upload = report.write_units / options.uploads.max(1) as f64;
    report.step_runs = runs.load(std::sync::atomic::Ordering::Relaxed);
    // Every upload is live: the job must count each, and each must count it.
    let input_hash = crate::key::sha256_hex(bytes);
    let job = crate::key::job_key(&input_hash, &app.config.recipes[0].recipe_hash);
    let refs = app
        .ledger
        .references(&job)
        .await
        .map_err(|e| e.to_string())?
        .len() as u64;
    report.refs_mismatches = refs.abs_diff(options.uploads);
    for n in 0..options.uploads {
        let version = VersionName {
            bucket: BUCKET.into(),
            key: format!("u/{n}.jpg"),
            version_id: None,
        };
        let row = app
            .ledger
            .version_refs(&version)
            .await
            .map_err(|e| e.to_string())?;
        if !row.is_some_and(|row| row.job_keys.contains(&job)) {
            report.uncounted_versions += 1;
        }
    }
    Ok(report)
}

/// One message, received until it is acknowledged or dead-lettered: the
/// receives, and whether it was acknowledged.
async fn deliver(
    app: Arc<App>,
    queue: Arc<RecordingQueue>,
    message_id: String,
    body: String,
) -> (u32, bool) {
    for receive in 1..=MAX_RECEIVES {
        let mut message = SqsMessage::default();
        message.message_id = Some(message_id.clone());
        let receipt = format!("{message_id}-{receive}");
        message.receipt_handle = Some(receipt.clone());
        message.body = Some(body.clone());
        message.event_source_arn = Some(QUEUE_ARN.to_string());
        let mut event = SqsEvent::default();
        event.records = vec![message];
        let invocation = Invocation {
            request_id: receipt.clone(),
            deadline_ms: Some(app.now_ms() + FUNCTION_TIMEOUT_MS),
            timeout_ms: Some(FUNCTION_TIMEOUT_MS),
        };
        let report = handle_batch(app.clone(), event, invocation).await;
        if report.response().batch_item_failures.is_empty() {
            return (receive, true);
        }
        let delay_ms = queue
            .delay_of(&receipt)
            .map_or(VISIBILITY_MS, |seconds| seconds.max(0) as u64 * 1_000);
        tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
    }
    (MAX_RECEIVES, false)
}

/// The burst as text, for the terminal.
pub fn render_burst(report: &BurstReport) -> String {
    let o = &report.options;
    format!(
        "Burst: {} uploads of one content at {}/s ({} ms runs, transactions held {} ms)\n\
         deliveries {}, dead-lettered {}, step runs {}\n\
         DynamoDB refused {} for conflicts and {} for throttles; retried in-process {} and {}\n\
         references: {} reference item(s) missing or extra, {} live version(s) unreferenced\n\
         write units {:.0} ({:.2} per upload); drained in {:.1} virtual seconds\n",
        report.uploads,
        o.rate,
        o.run_ms,
        o.transaction_ms,
        report.deliveries,
        report.dead_lettered,
        report.step_runs,
        report.conflicts,
        report.throttles,
        report.conflicts_retried,
        report.throttles_retried,
        report.refs_mismatches,
        report.uncounted_versions,
        report.write_units,
        report.write_units_per_upload,
        report.seconds_to_drain,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gentle burst (20 uploads at 10 a second) is absorbed: the job runs
    /// once, every upload is acknowledged and counted.
    #[tokio::test(start_paused = true)]
    async fn a_gentle_burst_runs_once_and_counts_every_upload() {
        let report = simulate_burst(&BurstOptions {
            uploads: 20,
            rate: 10,
            ..BurstOptions::default()
        })
        .await
        .unwrap();
        assert_eq!(report.step_runs, 1, "{report:?}");
        assert_eq!(report.dead_lettered, 0, "{report:?}");
        assert_eq!(report.refs_mismatches, 0, "{report:?}");
        assert_eq!(report.uncounted_versions, 0, "{report:?}");
    }

    /// A meme at 1,000 uploads a second: no item is on every upload's
    /// write path (issue 24's finding 3), so nothing conflicts or is
    /// throttled, nothing reaches the DLQ, every upload has its reference
    /// item, and the job runs once.
    #[tokio::test(start_paused = true)]
    async fn a_hot_burst_runs_once_and_references_every_upload() {
        let report = simulate_burst(&BurstOptions {
            uploads: 1_000,
            rate: 1_000,
            ..BurstOptions::default()
        })
        .await
        .unwrap();
        assert_eq!(report.step_runs, 1, "{report:?}");
        assert!(report.deliveries >= report.uploads);
        assert_eq!(report.dead_lettered, 0, "{report:?}");
        assert_eq!(report.refs_mismatches, 0, "{report:?}");
        assert_eq!(report.uncounted_versions, 0, "{report:?}");
        assert_eq!((report.conflicts, report.throttles), (0, 0), "{report:?}");
    }
}
