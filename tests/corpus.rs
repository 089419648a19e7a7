//! Malformed and unusual bodies (`tests/corpus/bodies.json`), each with its
//! documented outcome: acknowledged, or a batch item failure whose error names
//! what was wrong. None panics, none is lost.

mod common;

use aws_lambda_events::event::sqs::SqsMessage;
use common::{failed_ids, Options, Pipeline};
use mediaonce::handler::Outcome;
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    name: String,
    /// `ack` or `retry`.
    outcome: String,
    why: String,
    body: String,
    /// What the error must say, for `retry`.
    error: Option<String>,
}

const REAL_KEY: &str = "corpus/real object+1.bin";
const REAL_KEY_ENCODED: &str = "corpus/real+object%2B1.bin";

fn cases() -> Vec<Case> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/bodies.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn thousand_records(bucket: &str, etag: &str) -> String {
    let record = serde_json::json!({
        "eventName": "ObjectCreated:Put",
        "s3": {"bucket": {"name": bucket}, "object": {"key": REAL_KEY_ENCODED, "eTag": etag, "size": 4}}
    });
    serde_json::json!({ "Records": vec![record; 1000] }).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_body_has_its_documented_outcome() {
    let p = Pipeline::new(Options::default()).await;
    let put = p.put(REAL_KEY, b"real", true).await;
    let etag = put.e_tag.unwrap().trim_matches('"').to_string();
    let cases = cases();
    assert!(cases.len() >= 30, "{} cases", cases.len());

    let messages: Vec<SqsMessage> = cases
        .iter()
        .map(|case| {
            let body = if case.name == "thousand-records" {
                thousand_records(&p.bucket, &etag)
            } else {
                case.body
                    .replace("{bucket}", &p.bucket)
                    .replace("{key}", REAL_KEY_ENCODED)
                    .replace("{raw_key}", REAL_KEY)
                    .replace("{etag}", &etag)
            };
            let mut message = SqsMessage::default();
            message.message_id = Some(case.name.clone());
            message.receipt_handle = Some(format!("receipt-{}", case.name));
            message.body = Some(body);
            message.event_source_arn = Some(p.queue_arn.clone());
            message
        })
        .collect();
    let report = p.handle(messages).await;
    assert_eq!(report.messages.len(), cases.len(), "no message lost");

    let failed = failed_ids(&report);
    let mut wrong = Vec::new();
    for (case, message) in cases.iter().zip(&report.messages) {
        assert_eq!(message.message_id, case.name);
        let retried = failed.contains(&case.name);
        let error = message.error.clone().unwrap_or_default();
        let expected_retry = case.outcome == "retry";
        let error_ok = case
            .error
            .as_deref()
            .is_none_or(|needle| error.contains(needle));
        if retried != expected_retry || !error_ok || error.contains("task failed") {
            wrong.push(format!(
                "{}: expected {} ({}), got {} with error {error:?}, jobs {:?}",
                case.name,
                case.outcome,
                case.why,
                if retried { "retry" } else { "ack" },
                message.jobs
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // Every body naming the real object shares one job: it ran once.
    assert_eq!(
        report.count(Outcome::Ran),
        1,
        "{:?}",
        report
            .jobs()
            .filter(|j| j.outcome == Outcome::Ran)
            .collect::<Vec<_>>()
    );
}
