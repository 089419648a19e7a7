//! A chaos soak on the emulators. Uploads (10% byte-identical to an earlier
//! one, 2% deliberate poison) notify a queue; a router delivers every
//! notification 1 to 3 times to the work queue, as S3 may; 4 workers pull
//! batches concurrently and crash at a random phase with some probability,
//! and crashed batches come back by visibility timeout, as in production.
//! Each upload runs a probe and a probe of that probe's output (a chained
//! recipe). When the queue is drained, every unique (content, recipe) has exactly one
//! done row with a complete, correct manifest, step executions are the
//! unique jobs plus the runs crashes cut short, and the DLQ holds only the
//! poison.
//!
//! `SOAK_UPLOADS` sets the size (default 500; e.g. 5000 for a long run),
//! `SOAK_SEED` the randomness (default: a fresh seed, printed).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, QueueAttributeName, SendMessageBatchRequestEntry,
};
use common::{
    failed_ids, handle_before, lambda_message, queue_arn, receive_from, unique, Options, Pipeline,
};
use mediaonce::config::{ENV_DEADLINE_MARGIN_SECS, ENV_LEASE_MARGIN_SECS, ENV_METRICS};
use mediaonce::faults::{Call, FaultPlan};
use mediaonce::handler::{BatchReport, Outcome};
use mediaonce::key::{job_key, sha256_hex};
use mediaonce::ledger::JobStatus;
use mediaonce::step::Manifest;

const WORKERS: usize = 4;
/// Visibility timeout of the work queue, and the invocation a worker gets:
/// a crashed batch comes back after it, and by then its leases have passed.
/// A message walks two levels of its pipeline (twice the calls of one job)
/// on an emulator that serves one DynamoDB call at a time, shared by every
/// worker: at 3 s, a third of the deliveries were cut off by the deadline
/// and a few reached the DLQ for want of time, not for a fault.
const VISIBILITY_SECS: i32 = 6;
const INVOCATION_MS: u64 = 6_000;
const MAX_RECEIVES: usize = 8;
const CRASH_PROBABILITY: f64 = 0.15;
/// The soak gives up (and fails) after this long.
const BOUND: Duration = Duration::from_secs(600);

/// Where a worker crashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Crash {
    /// Before handling: nothing happened, the batch comes back.
    BeforeHandling,
    /// After claiming, as the step starts reading: no finish.
    InStep,
    /// After the step and its outputs, before finishing.
    BeforeFinish,
    /// After finishing, before the messages are deleted.
    BeforeDelete,
}

#[derive(Default)]
struct Tally {
    batches: AtomicUsize,
    deliveries_handled: AtomicUsize,
    crashes: Mutex<BTreeMap<String, usize>>,
    /// Step runs cut short by a crash (their finish never happened).
    crashed_runs: AtomicUsize,
    /// Runs whose finish was rejected: their lease had been taken over.
    stale_runs: AtomicUsize,
    outcomes: Mutex<BTreeMap<&'static str, usize>>,
    /// Why jobs failed, by the reason's first words.
    failures: Mutex<BTreeMap<String, usize>>,
    /// Messages the invocation deadline cut off (their step may have run).
    cut_off: AtomicUsize,
    /// Signalled by a worker whose long-poll came back empty.
    idle: tokio::sync::Notify,
    /// Every report of each job, in order: printed for a job that ends
    /// wrong.
    history: Mutex<BTreeMap<String, Vec<String>>>,
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn queue_with_dlq(p: &Pipeline) -> (String, String, String) {
    let create = |name: String, attributes: Vec<(QueueAttributeName, String)>| {
        let sqs = p.sqs.clone();
        async move {
            let mut request = sqs.create_queue().queue_name(name);
            for (k, v) in attributes {
                request = request.attributes(k, v);
            }
            request.send().await.unwrap().queue_url.unwrap()
        }
    };
    let dlq = create(unique("dlq"), vec![]).await;
    let dlq_arn = queue_arn(&p.sqs, &dlq).await;
    let redrive =
        serde_json::json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": MAX_RECEIVES})
            .to_string();
    let work = create(
        unique("work"),
        vec![
            (
                QueueAttributeName::VisibilityTimeout,
                VISIBILITY_SECS.to_string(),
            ),
            (QueueAttributeName::RedrivePolicy, redrive),
        ],
    )
    .await;
    let work_arn = queue_arn(&p.sqs, &work).await;
    (work, work_arn, dlq)
}

async fn queue_is_empty(p: &Pipeline, url: &str) -> bool {
    let attributes = p
        .sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesDelayed)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap_or_default();
    attributes.values().all(|v| v == "0")
}

fn tally_report(tally: &Tally, report: &BatchReport, crashed_batch: bool) {
    let mut outcomes = tally.outcomes.lock().unwrap();
    let cut_off = report
        .messages
        .iter()
        .filter(|m| m.error.as_deref() == Some("unfinished at the invocation deadline"))
        .count();
    tally.cut_off.fetch_add(cut_off, Ordering::SeqCst);
    // Only the counted step's runs are step executions here (poison runs
    // another); a job carried by several messages of the batch ran once.
    let mut crashed = BTreeSet::new();
    let mut stale = BTreeSet::new();
    for (message, job) in report
        .messages
        .iter()
        .flat_map(|m| m.jobs.iter().map(move |j| (m, j)))
    {
        tally
            .history
            .lock()
            .unwrap()
            .entry(job.job_key.clone())
            .or_default()
            .push(format!(
                "{} attempt {} ({}){}: {}",
                job.outcome.as_str(),
                job.attempt,
                message.message_id,
                if crashed_batch { " crashed batch" } else { "" },
                job.reason.as_deref().unwrap_or("")
            ));
        *outcomes.entry(job.outcome.as_str()).or_default() += 1;
        if job.outcome == Outcome::Failed {
            let reason: String = job
                .reason
                .clone()
                .unwrap_or_default()
                .chars()
                .take(90)
                .collect();
            *tally.failures.lock().unwrap().entry(reason).or_default() += 1;
        }
    }
    for job in report.jobs().filter(|j| j.step == "counted-probe") {
        let reason = job.reason.as_deref().unwrap_or_default();
        if crashed_batch
            && reason.contains("injected fault: crash")
            && reason.contains("UpdateItem")
        {
            crashed.insert(job.job_key.clone());
        }
        if job.outcome == Outcome::Busy && reason.contains("lease lost") {
            stale.insert(job.job_key.clone());
        }
    }
    tally
        .crashed_runs
        .fetch_add(crashed.len(), Ordering::SeqCst);
    tally.stale_runs.fetch_add(stale.len(), Ordering::SeqCst);
}

#[allow(clippy::too_many_arguments)]
async fn worker(
    p: Arc<Pipeline>,
    work_url: String,
    work_arn: String,
    seed: u64,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
) {
    let mut rng = fastrand::Rng::with_seed(seed);
    while !stop.load(Ordering::SeqCst) {
        let received = receive_from(&p.sqs, &work_url).await;
        if received.is_empty() {
            tally.idle.notify_one();
            continue;
        }
        tally.batches.fetch_add(1, Ordering::SeqCst);
        tally
            .deliveries_handled
            .fetch_add(received.len(), Ordering::SeqCst);
        let messages: Vec<_> = received
            .into_iter()
            .map(|m| lambda_message(m, &work_arn))
            .collect();
        let crash = (rng.f64() < CRASH_PROBABILITY).then(|| match rng.usize(0..4) {
            0 => Crash::BeforeHandling,
            1 => Crash::InStep,
            2 => Crash::BeforeFinish,
            _ => Crash::BeforeDelete,
        });
        if let Some(crash) = crash {
            *tally
                .crashes
                .lock()
                .unwrap()
                .entry(format!("{crash:?}"))
                .or_default() += 1;
        }
        // A crash is a process that stops making calls: every call of the
        // kind fails from that point, and nothing is deleted.
        let faults = Arc::new(FaultPlan::new());
        match crash {
            Some(Crash::BeforeHandling) => continue,
            Some(Crash::InStep) => {
                faults.fail(Call::GetObject, usize::MAX, "crash");
                faults.fail(Call::Finish, usize::MAX, "crash");
            }
            Some(Crash::BeforeFinish) => {
                faults.fail(Call::Finish, usize::MAX, "crash");
            }
            Some(Crash::BeforeDelete) | None => {}
        }
        let app = p.seeded_worker(0, faults, rng.u64(..));
        let deadline = app.now_ms() + INVOCATION_MS;
        let report = handle_before(app, messages.clone(), deadline).await;
        tally_report(&tally, &report, crash.is_some());
        if crash.is_some() {
            continue;
        }
        // As the event source mapping does: delete what was not reported.
        let failed: BTreeSet<String> = failed_ids(&report).into_iter().collect();
        let entries: Vec<_> = messages
            .iter()
            .filter(|m| !failed.contains(m.message_id.as_deref().unwrap_or_default()))
            .enumerate()
            .map(|(i, m)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(m.receipt_handle.clone().unwrap())
                    .build()
                    .unwrap()
            })
            .collect();
        if !entries.is_empty() {
            p.sqs
                .delete_message_batch()
                .queue_url(&work_url)
                .set_entries(Some(entries))
                .send()
                .await
                .unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_soak() {
    let uploads = env_usize("SOAK_UPLOADS", 500);
    let seed = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    println!("soak: {uploads} uploads, seed {seed} (SOAK_SEED={seed} repeats it)");
    let mut rng = fastrand::Rng::with_seed(seed);
    let p = Arc::new(
        Pipeline::new(Options {
            recipes: Some(
                r#"[{"name":"probe","step":"counted-probe","version":1,"params":{},"match":{"prefix":"up/"}},
                    {"name":"probe-of-probe","step":"counted-probe","version":2,"params":{},
                     "input":{"recipe":"probe","file":"probe.json"}},
                    {"step":"panics","version":1,"params":{},"match":{"prefix":"poison/"}}]"#
                    .into(),
            ),
            vars: vec![
                (ENV_LEASE_MARGIN_SECS, "0".into()),
                (ENV_DEADLINE_MARGIN_SECS, "1".into()),
                // Its counts are printed below; an EMF line per batch
                // would bury them (tests/events.rs checks the metrics).
                (ENV_METRICS, "off".into()),
            ],
            ..Options::default()
        })
        .await,
    );
    let started = Instant::now();

    // Uploads: 10% repeat an earlier upload's bytes, 2% are poison.
    let mut contents: Vec<Vec<u8>> = Vec::new();
    let mut unique_hashes = BTreeSet::new();
    // Object versions (one key each) per content: its job's `refs`.
    let mut versions_of: BTreeMap<String, u64> = BTreeMap::new();
    let mut poison_hashes = BTreeSet::new();
    let mut poison = 0;
    for i in 0..uploads {
        let is_poison = rng.f64() < 0.02;
        let bytes = if !contents.is_empty() && rng.f64() < 0.10 {
            contents[rng.usize(0..contents.len())].clone()
        } else {
            format!("upload {i} of soak {seed}: {}", rng.u64(..)).into_bytes()
        };
        let key = if is_poison {
            poison += 1;
            poison_hashes.insert(sha256_hex(&bytes));
            format!("poison/{i}.bin")
        } else {
            unique_hashes.insert(sha256_hex(&bytes));
            *versions_of.entry(sha256_hex(&bytes)).or_default() += 1;
            contents.push(bytes.clone());
            format!("up/{i}.bin")
        };
        p.put(&key, &bytes, true).await;
    }

    // The router: every notification 1 to 3 times to the work queue.
    let (work_url, work_arn, dlq_url) = queue_with_dlq(&p).await;
    let mut notifications = Vec::new();
    let mut empty_polls = 0;
    while notifications.len() < uploads && empty_polls < 10 {
        let got = p.receive_batch().await;
        empty_polls = if got.is_empty() { empty_polls + 1 } else { 0 };
        notifications.extend(got.into_iter().filter(|m| {
            !m.body
                .as_deref()
                .unwrap_or_default()
                .contains("s3:TestEvent")
        }));
    }
    assert_eq!(notifications.len(), uploads, "every upload notified");
    let mut deliveries = 0;
    for chunk in notifications.chunks(3) {
        let mut entries = Vec::new();
        for message in chunk {
            for _ in 0..rng.usize(1..=3) {
                entries.push(
                    SendMessageBatchRequestEntry::builder()
                        .id(entries.len().to_string())
                        .message_body(message.body.clone().unwrap_or_default())
                        .build()
                        .unwrap(),
                );
            }
        }
        deliveries += entries.len();
        p.sqs
            .send_message_batch()
            .queue_url(&work_url)
            .set_entries(Some(entries))
            .send()
            .await
            .unwrap();
    }

    // The workers, until the work queue is drained.
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..WORKERS)
        .map(|i| {
            tokio::spawn(worker(
                p.clone(),
                work_url.clone(),
                work_arn.clone(),
                seed.wrapping_add(i as u64 + 1),
                tally.clone(),
                stop.clone(),
            ))
        })
        .collect();
    // Drained: the queue reports nothing visible, in flight or delayed at
    // three idle polls in a row (a worker's empty long-poll wakes this loop).
    let mut empty_checks = 0;
    while empty_checks < 3 {
        assert!(
            started.elapsed() < BOUND,
            "the soak did not drain within {BOUND:?}"
        );
        tally.idle.notified().await;
        empty_checks = if queue_is_empty(&p, &work_url).await {
            empty_checks + 1
        } else {
            0
        };
    }
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.unwrap();
    }

    // What happened, printed before anything is asserted.
    println!("soak: crashes {:?}", tally.crashes.lock().unwrap());
    println!("soak: job outcomes {:?}", tally.outcomes.lock().unwrap());
    println!("soak: failures {:#?}", tally.failures.lock().unwrap());
    println!(
        "soak: {} messages cut off by the invocation deadline",
        tally.cut_off.load(Ordering::SeqCst)
    );

    // The DLQ: only poison.
    let mut dead_letters = Vec::new();
    loop {
        let got = receive_from(&p.sqs, &dlq_url).await;
        if got.is_empty() {
            break;
        }
        for m in got {
            p.sqs
                .delete_message()
                .queue_url(&dlq_url)
                .receipt_handle(m.receipt_handle.clone().unwrap())
                .send()
                .await
                .unwrap();
            dead_letters.push(m.body.unwrap_or_default());
        }
    }
    let not_poison: Vec<_> = dead_letters
        .iter()
        .filter(|b| !b.contains("poison/"))
        .collect();

    println!("soak: dead letters not poison: {not_poison:#?}");

    // Every unique (content, recipe): exactly one done row, a correct
    // manifest. The chained recipe's job is keyed by the SHA-256 its
    // upstream's manifest records for probe.json.
    let recipe_hash = p.app.config.recipes[0].recipe_hash.clone();
    let chained_hash = p.app.config.recipes[1].recipe_hash.clone();
    let ref_counts = p.ref_counts().await;
    let mut done = 0;
    let mut jobs: Vec<(String, String, u64)> = Vec::new();
    for input_hash in &unique_hashes {
        let key = job_key(input_hash, &recipe_hash);
        let upstream: Manifest =
            serde_json::from_slice(&p.output(&format!("derived/{key}/_manifest.json")).await)
                .unwrap_or_else(|e| panic!("the manifest of {key}: {e}"));
        let file = &upstream.outputs[0];
        assert_eq!(file.name, "probe.json");
        let versions = versions_of[input_hash];
        jobs.push((key, input_hash.clone(), versions));
        jobs.push((
            job_key(&file.sha256, &chained_hash),
            file.sha256.clone(),
            versions,
        ));
    }
    for (key, input_hash, versions) in &jobs {
        let row = p.row(key).await.unwrap_or_else(|| {
            panic!(
                "no row for {key}: {:#?}",
                tally.history.lock().unwrap().get(key)
            )
        });
        assert_eq!(
            row.status,
            JobStatus::Done,
            "{row:?}: {:#?}",
            tally.history.lock().unwrap().get(key)
        );
        // Exact under duplicates and crashes: one reference per upload.
        assert_eq!(
            ref_counts.get(key).copied().unwrap_or(0),
            *versions,
            "{row:?}"
        );
        let manifest: Manifest =
            serde_json::from_slice(&p.output(&format!("derived/{key}/_manifest.json")).await)
                .unwrap();
        assert_eq!(
            (manifest.job_key.as_str(), manifest.input_hash.as_str()),
            (key.as_str(), input_hash.as_str())
        );
        assert_eq!(manifest.outputs.len(), 1);
        for output in &manifest.outputs {
            let bytes = p.output(&format!("derived/{key}/{}", output.name)).await;
            assert_eq!(
                (bytes.len() as u64, sha256_hex(&bytes)),
                (output.size, output.sha256.clone())
            );
        }
        done += 1;
    }
    // Every job row (not the hash cache's or the references' rows that
    // share the table): a Scan returns at most 1 MB a page.
    let pages: Vec<_> = p
        .dynamodb
        .scan()
        .table_name(&p.table)
        .select(aws_sdk_dynamodb::types::Select::Count)
        .filter_expression(
            "NOT begins_with(job_key, :cache) AND NOT begins_with(job_key, :version)",
        )
        .expression_attribute_values(
            ":cache",
            aws_sdk_dynamodb::types::AttributeValue::S(
                mediaonce::identity::CACHE_ROW_PREFIX.into(),
            ),
        )
        .expression_attribute_values(
            ":version",
            aws_sdk_dynamodb::types::AttributeValue::S(
                mediaonce::references::VERSION_ROW_PREFIX.into(),
            ),
        )
        .into_paginator()
        .send()
        .collect()
        .await;
    let rows: usize = pages
        .into_iter()
        .map(|page| page.expect("scan page").count as usize)
        .sum();

    let executions = p.counted.runs();
    let crashed_runs = tally.crashed_runs.load(Ordering::SeqCst);
    let stale_runs = tally.stale_runs.load(Ordering::SeqCst);
    let cut_off = tally.cut_off.load(Ordering::SeqCst);
    println!(
        "soak: {uploads} uploads ({} unique contents, {poison} poison), {deliveries} deliveries routed, \
         {} deliveries handled in {} batches by {WORKERS} workers",
        unique_hashes.len(),
        tally.deliveries_handled.load(Ordering::SeqCst),
        tally.batches.load(Ordering::SeqCst),
    );
    println!(
        "soak: {done} done rows for {} unique jobs (each content's probe and its chained probe), \
         {rows} rows in all ({} poison); step executions {executions} = \
         {} unique + {crashed_runs} cut short by crashes + {stale_runs} stale \
         (+ at most {cut_off} cut off by the invocation deadline)",
        jobs.len(),
        poison_hashes.len(),
        jobs.len()
    );
    println!(
        "soak: DLQ {} messages ({} not poison); drained in {:.1} s",
        dead_letters.len(),
        not_poison.len(),
        started.elapsed().as_secs_f64()
    );

    assert_eq!(done, jobs.len());
    // One row per unique job and per poison content, nothing else.
    assert_eq!(rows, jobs.len() + poison_hashes.len());
    let accounted = jobs.len() + crashed_runs + stale_runs;
    assert!(
        (accounted..=accounted + cut_off).contains(&executions),
        "{executions} step executions, {accounted} accounted for, {cut_off} cut off"
    );
    assert!(
        not_poison.is_empty(),
        "DLQ holds more than poison: {not_poison:?}"
    );
    if poison > 0 {
        assert!(!dead_letters.is_empty(), "the poison reached the DLQ");
    }
}
