//! The sample events under `events/`: they round-trip through the Lambda
//! event types, their bodies parse as documented, and `mediaonce invoke`
//! answers each with the partial batch response the handler promises.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use mediaonce::event::{parse_body, EventKind, Notification};
use serde_json::Value;

fn events_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("events")
}

fn load(name: &str) -> SqsEvent {
    let text = std::fs::read_to_string(events_dir().join(name)).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn event_files() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(events_dir())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".json"))
        .collect();
    names.sort();
    names
}

#[test]
fn every_fixture_round_trips_through_the_lambda_types() {
    let names = event_files();
    assert!(names.len() >= 7, "{names:?}");
    for name in names {
        let original: Value =
            serde_json::from_str(&std::fs::read_to_string(events_dir().join(&name)).unwrap())
                .unwrap();
        if original.get("detail-type").is_some() {
            // An EventBridge event (what mediaonce publishes), below.
            continue;
        }
        let event: SqsEvent =
            serde_json::from_value(original.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let again: Value = serde_json::to_value(&event).unwrap();
        let reparsed: SqsEvent = serde_json::from_value(again.clone()).unwrap();
        assert_eq!(serde_json::to_value(&reparsed).unwrap(), again, "{name}");
        // Every field of the fixture survives the trip.
        for (i, record) in original["Records"].as_array().unwrap().iter().enumerate() {
            for (field, value) in record.as_object().unwrap() {
                assert_eq!(
                    &again["Records"][i][field], value,
                    "{name}: Records[{i}].{field}"
                );
            }
        }
    }
}

#[test]
fn the_completion_event_round_trips_as_an_application_receives_it() {
    use aws_lambda_events::event::eventbridge::EventBridgeEvent;
    let name = "completion-succeeded.json";
    let original: Value =
        serde_json::from_str(&std::fs::read_to_string(events_dir().join(name)).unwrap()).unwrap();
    let event: EventBridgeEvent =
        serde_json::from_value(original.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(event.source, mediaonce::pipeline::completion::SOURCE);
    assert_eq!(
        event.detail_type,
        mediaonce::pipeline::completion::SUCCEEDED
    );
    let again = serde_json::to_value(&event).unwrap();
    assert_eq!(again["detail"], original["detail"], "{name}");
    assert_eq!(again["resources"], original["resources"], "{name}");
}

fn only_record(name: &str) -> mediaonce::event::S3Record {
    let event = load(name);
    match parse_body(event.records[0].body.as_deref().unwrap()).unwrap() {
        Notification::Records(mut records) => records.remove(0),
        other => panic!("{name}: {other:?}"),
    }
}

#[test]
fn fixture_bodies_parse_as_documented() {
    let put = only_record("s3-put-versioned.json");
    assert_eq!(
        (put.kind(), put.key.as_str()),
        (EventKind::Created, "uploads/cat.png")
    );
    assert!(put.version_id.is_some());
    assert_eq!(
        only_record("key-with-spaces-and-plus.json").key,
        "my photos/a+b c (1).png"
    );
    assert!(only_record("multipart-upload.json")
        .etag
        .unwrap()
        .ends_with("-13"));
    assert_eq!(
        only_record("object-removed.json").kind(),
        EventKind::Removed
    );
    let test_event = load("s3-test-event.json");
    assert_eq!(
        parse_body(test_event.records[0].body.as_deref().unwrap()),
        Ok(Notification::TestEvent)
    );
    let bad = load("unparseable-body.json");
    assert!(parse_body(bad.records[0].body.as_deref().unwrap()).is_err());
    let twice = load("duplicate-in-batch.json");
    assert_eq!(twice.records.len(), 2);
    assert_eq!(twice.records[0].body, twice.records[1].body);
}

/// Runs `mediaonce invoke` as a user would, against the emulators.
fn invoke(name: &str, table: &str) -> (SqsBatchResponse, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_mediaonce"))
        .args(["invoke", "--pretty", "--event"])
        .arg(events_dir().join(name))
        .env("MEDIAONCE_TABLE", table)
        .env("MEDIAONCE_OUTPUT_BUCKET", "mediaonce-demo-input")
        .env_remove("MEDIAONCE_RECIPES")
        .output()
        .expect("mediaonce runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "{name}: exit {:?}\n{stderr}",
        output.status
    );
    let last = stdout.lines().last().unwrap_or_default();
    let response =
        serde_json::from_str(last).unwrap_or_else(|e| panic!("{name}: last line {last:?}: {e}"));
    (response, stderr)
}

fn failed_ids(response: &SqsBatchResponse) -> Vec<String> {
    response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect()
}

#[tokio::test]
async fn invoke_answers_each_fixture() {
    let sdk = mediaonce::aws::load_sdk_config().await;
    let table = common::unique("invoke");
    common::create_table(&mediaonce::aws::dynamodb_client(&sdk), &table).await;
    let s3 = mediaonce::aws::s3_client(&sdk);
    // The bucket the fixtures name, holding the sample the key-with-spaces event announces.
    let bucket = "mediaonce-demo-input";
    let _ = s3.create_bucket().bucket(bucket).send().await;
    let sample = std::fs::read(events_dir().join("sample.png")).unwrap();
    s3.put_object()
        .bucket(bucket)
        .key("my photos/a+b c (1).png")
        .body(sample.into())
        .send()
        .await
        .expect("put sample");

    let (response, _) = invoke("s3-test-event.json", &table);
    assert!(failed_ids(&response).is_empty());
    let (response, _) = invoke("object-removed.json", &table);
    assert!(failed_ids(&response).is_empty());
    let (response, stderr) = invoke("unparseable-body.json", &table);
    assert_eq!(
        failed_ids(&response),
        vec!["00000006-7e2f-4c1b-9d3a-5b8e1f2a6c4d"]
    );
    assert!(
        stderr.contains("00000006-7e2f-4c1b-9d3a-5b8e1f2a6c4d") && stderr.contains("not JSON"),
        "{stderr}"
    );
    // The multipart object was never uploaded here: skipped, acknowledged.
    let (response, stderr) = invoke("multipart-upload.json", &table);
    assert!(failed_ids(&response).is_empty());
    assert!(stderr.contains("skipped"), "{stderr}");
    // The sample exists: the step runs, then a second delivery reuses it.
    let (response, stderr) = invoke("key-with-spaces-and-plus.json", &table);
    assert!(failed_ids(&response).is_empty(), "{stderr}");
    assert!(
        stderr.contains("outcome=\"ran\"") || stderr.contains("outcome=ran"),
        "{stderr}"
    );
    // The summary for a person, then the batch's metrics: raw EMF lines on
    // stderr (stdout is the answer).
    assert!(
        stderr.contains("batch: 1 message(s), 1 job(s): ran 1; 0 message(s) come back"),
        "{stderr}"
    );
    let documents: Vec<serde_json::Value> = stderr
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|document| document.get("_aws").is_some())
        .collect();
    let jobs: Vec<(&str, &str, u64)> = documents
        .iter()
        .filter_map(|d| {
            Some((
                d["Step"].as_str()?,
                d["Outcome"].as_str()?,
                d["Jobs"].as_u64()?,
            ))
        })
        .collect();
    assert_eq!(jobs, [("probe", "ran", 1)], "{stderr}");
    let batch = documents.last().expect("a batch document");
    assert_eq!(
        batch["_aws"]["CloudWatchMetrics"][0]["Namespace"],
        "mediaonce"
    );
    assert_eq!(
        (batch["BatchSize"].as_u64(), batch["ColdStart"].as_u64()),
        (Some(1), Some(1))
    );
    assert!(batch["InputBytesRead"].as_u64() > Some(0), "{batch}");
    assert!(batch["OutputBytesWritten"].as_u64() > Some(0), "{batch}");
    assert!(batch["DynamoDbCalls"].as_u64() >= Some(3), "{batch}");
    let (response, stderr) = invoke("key-with-spaces-and-plus.json", &table);
    assert!(failed_ids(&response).is_empty(), "{stderr}");
    assert!(stderr.contains("reused"), "{stderr}");
}

#[test]
fn invoke_without_a_table_names_the_variable() {
    let output = Command::new(env!("CARGO_BIN_EXE_mediaonce"))
        .args(["invoke", "--event"])
        .arg(events_dir().join("s3-test-event.json"))
        .env_remove("MEDIAONCE_TABLE")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("MEDIAONCE_TABLE"));
}
