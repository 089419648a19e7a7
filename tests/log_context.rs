//! Every log line of a batch names its request. Alone in its test binary,
//! with a global subscriber: tracing caches each callsite's interest
//! process-wide, so a thread-local subscriber (`set_default`) in a binary
//! whose other tests log in parallel could miss lines whose callsites
//! another thread registered first (it did, once, on a loaded machine).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use mediaonce::config::Config;
use mediaonce::handler::{handle_batch, App, Invocation};
use mediaonce::ledger::memory::InMemoryTable;
use mediaonce::ledger::Ledger;
use mediaonce::queue::{Queue, RecordingQueue};
use mediaonce::steps::StepRegistry;
use mediaonce::store::memory::InMemoryObjects;
use mediaonce::store::ObjectStore;

/// What the subscriber wrote.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
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
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_log_line_of_a_batch_names_its_request() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");

    let steps = StepRegistry::builtin();
    let vars = HashMap::from([
        ("MEDIAONCE_TABLE", "jobs"),
        ("MEDIAONCE_OUTPUT_BUCKET", "in"),
    ]);
    let config = Config::from_lookup(|name| vars.get(name).map(|v| v.to_string()), &steps).unwrap();
    let objects = InMemoryObjects::new();
    let app = Arc::new(App::new(
        config,
        Ledger::new(InMemoryTable::new("jobs")),
        ObjectStore::new(objects.clone()),
        Queue::new(Arc::new(RecordingQueue::default())),
    ));
    let etag = objects.insert("in", "a.bin", b"abc", true);
    let mut event = SqsEvent::default();
    // One message that runs a job, one whose object is gone: both log.
    event.records = vec![message("1", "a.bin", &etag), message("2", "gone.bin", "x")];
    let invocation = Invocation {
        request_id: "req".into(),
        deadline_ms: Some(app.now_ms() + 60_000),
        timeout_ms: None,
    };
    handle_batch(app, event, invocation).await;

    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let logged: Vec<&str> = text.lines().collect();
    assert!(logged.len() >= 3, "{text}");
    for line in logged {
        assert!(line.contains("batch{request_id=req}"), "{line}");
    }
}
