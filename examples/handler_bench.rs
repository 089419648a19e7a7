//! The handler's own cost (`bench/handler.sh`), on the simulation's
//! in-memory clients with a latency per call, as a network would add:
//!
//! (a) a batch of 10 distinct messages (first runs of `probe`) against the
//!     same 10 handled one by one: the wall time of each and their ratio;
//! (b) the duplicate path with no latency: batches of 10 messages whose
//!     jobs are all done, handled on one thread; messages per second of
//!     that thread's CPU time.
//!
//! `handler_bench [dynamodb_ms head_ms get_ms] [duplicate_batches]`
//! (defaults 5 15 30 and 2000). Prints `name value` lines.

use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use mediaonce::config::Config;
use mediaonce::ledger::Ledger;
use mediaonce::queue::{Queue, RecordingQueue};
use mediaonce::simulate::clients::{SimObjects, SimTable};
use mediaonce::steps::StepRegistry;
use mediaonce::store::ObjectStore;
use mediaonce::{handle_batch, App, Invocation, Outcome};

const BUCKET: &str = "in";
const QUEUE_ARN: &str = "arn:aws:sqs:us-east-1:123456789012:jobs";

struct Latency {
    dynamodb: Duration,
    head: Duration,
    get: Duration,
}

/// A fresh app with `count` objects uploaded, and their messages.
fn app(latency: &Latency, metrics: &str, count: usize) -> (Arc<App>, Vec<SqsMessage>) {
    let mut table = SimTable::new();
    table.latency = latency.dynamodb;
    let mut objects = SimObjects::new();
    objects.head_latency = latency.head;
    objects.get_latency = latency.get;
    let messages = (0..count)
        .map(|i| {
            let key = format!("photos/{i}.bin");
            let bytes = format!("object {i}: {}", "x".repeat(4096));
            let etag = objects.inner.insert(BUCKET, &key, bytes.as_bytes(), true);
            let body = serde_json::json!({"Records": [{
                "eventName": "ObjectCreated:Put",
                "s3": {"bucket": {"name": BUCKET},
                       "object": {"key": key, "eTag": etag, "size": bytes.len(), "sequencer": format!("{i:016X}")}}
            }]});
            let mut message = SqsMessage::default();
            message.message_id = Some(format!("m-{i}"));
            message.receipt_handle = Some(format!("r-{i}"));
            message.body = Some(body.to_string());
            message.event_source_arn = Some(QUEUE_ARN.into());
            message
        })
        .collect();
    let vars = [
        ("MEDIAONCE_TABLE", "jobs"),
        ("MEDIAONCE_OUTPUT_BUCKET", "out"),
        ("MEDIAONCE_METRICS", metrics),
    ];
    let config = Config::from_lookup(
        |name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        },
        &StepRegistry::builtin(),
    )
    .expect("configuration");
    let app = App::new(
        config,
        Ledger::new(table),
        ObjectStore::new(objects),
        Queue::new(Arc::new(RecordingQueue::default())),
    );
    (Arc::new(app), messages)
}

async fn handle(app: &Arc<App>, messages: Vec<SqsMessage>) -> Vec<Outcome> {
    let mut event = SqsEvent::default();
    event.records = messages;
    let invocation = Invocation {
        request_id: "bench".into(),
        deadline_ms: Some(app.now_ms() + 60_000),
        timeout_ms: None,
    };
    let report = handle_batch(app.clone(), event, invocation).await;
    report.jobs().map(|j| j.outcome).collect()
}

/// This process's CPU time (user + system), from /proc.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15 (11 and 12 after the name).
    let ticks: u64 = fields
        .get(11..13)
        .map(|f| f.iter().filter_map(|t| t.parse::<u64>().ok()).sum())
        .unwrap_or(0);
    Duration::from_millis(ticks * 10) // USER_HZ is 100 on Linux
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let arg = |i: usize, default: u64| args.get(i).copied().unwrap_or(default);
    let latency = Latency {
        dynamodb: Duration::from_millis(arg(0, 5)),
        head: Duration::from_millis(arg(1, 15)),
        get: Duration::from_millis(arg(2, 30)),
    };
    let duplicate_batches = arg(3, 2000) as usize;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        // (a) One batch of 10, then the same 10 one by one (a fresh table each).
        let (batched, messages) = app(&latency, "off", 10);
        let started = Instant::now();
        let outcomes = handle(&batched, messages).await;
        let batch_ms = started.elapsed().as_secs_f64() * 1e3;
        assert!(outcomes.iter().all(|o| *o == Outcome::Ran), "{outcomes:?}");
        let (sequential, messages) = app(&latency, "off", 10);
        let started = Instant::now();
        for message in messages {
            let outcomes = handle(&sequential, vec![message]).await;
            assert_eq!(outcomes, [Outcome::Ran]);
        }
        let sequential_ms = started.elapsed().as_secs_f64() * 1e3;
        println!("batch_of_10_ms {batch_ms:.1}");
        println!("one_by_one_ms {sequential_ms:.1}");
        println!("batch_over_one_by_one {:.3}", batch_ms / sequential_ms);
    });

    // (b) The duplicate path on one thread, no latency, metrics on.
    let none = Latency {
        dynamodb: Duration::ZERO,
        head: Duration::ZERO,
        get: Duration::ZERO,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let (app, messages) = app(&none, "on", 10);
        handle(&app, messages.clone()).await;
        let cpu = cpu_time();
        let started = Instant::now();
        for _ in 0..duplicate_batches {
            let outcomes = handle(&app, messages.clone()).await;
            debug_assert!(outcomes.iter().all(|o| *o == Outcome::Reused));
        }
        let wall = started.elapsed().as_secs_f64();
        let cpu = (cpu_time() - cpu).as_secs_f64().max(1e-3);
        let handled = (duplicate_batches * messages.len()) as f64;
        println!("duplicate_messages {handled:.0}");
        println!("duplicate_wall_s {wall:.3}");
        println!("duplicate_cpu_s {cpu:.3}");
        println!("duplicate_messages_per_cpu_second {:.0}", handled / cpu);
    });
}
