//! Parsing the body of an SQS message that S3 sent. Pure: no I/O.
//!
//! Parsing is lenient about fields we do not use (moto omits `userIdentity`
//! and `versionId`, LocalStack omits others) and strict about the ones we do:
//! a record without a bucket name or object key is an error that names it.

use serde::Deserialize;
use serde_json::Value;

use crate::key::json_type;
use crate::pipeline::split::{ExecutionClosed, SplitTask};
use crate::pipeline::HandOn;

/// What one SQS message body holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Notification {
    /// `s3:TestEvent`, sent when a notification configuration is saved.
    TestEvent,
    /// One or more S3 event records.
    Records(Vec<S3Record>),
    /// A task of a split's Step Functions execution, with its token.
    SplitTask(Box<SplitTask>),
    /// A split's execution closed without succeeding (EventBridge).
    ExecutionClosed(Box<ExecutionClosed>),
}

/// The event name of a record made from a hand-on message
/// ([`crate::pipeline::HandOn`]): a create whose pipeline goes on.
pub const HAND_ON_EVENT: &str = "mediaonce:PipelineHandOn";

/// The part of an S3 event record that mediaonce uses.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct S3Record {
    /// For example `ObjectCreated:Put`.
    pub event_name: String,
    pub bucket: String,
    /// The object key, URL-decoded.
    pub key: String,
    pub version_id: Option<String>,
    /// The ETag as S3 put it in the event: no quotes; `-N` for multipart.
    pub etag: Option<String>,
    pub size: Option<u64>,
    /// S3's `sequencer`: hexadecimal, ordering the events of one key. Kept
    /// for logs only: references never rest on event order (DESIGN.md,
    /// "References"), since emulators repeat one sequencer and
    /// `reprocess`, `backfill` and `refs rebuild` have none.
    pub sequencer: Option<String>,
    /// EventBridge's `deletion-type` of an `Object Deleted` event
    /// (`Permanently Deleted` or `Delete Marker Created`).
    pub deletion_type: Option<String>,
    /// A hand-on message's count and recipes; `None` for S3's records.
    pub handed_on: Option<HandedOn>,
}

/// What a hand-on record ([`HandOn`]) carries beyond an S3 record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HandedOn {
    /// The hand-ons of the version's pipeline, this one included.
    pub count: u32,
    /// The recipes handed on.
    pub recipes: Vec<String>,
    /// The job a split's execution ran for this version ([`HandOn::ran`]).
    pub ran: Option<String>,
}

impl S3Record {
    /// From S3's event name (`ObjectCreated:Put`, `ObjectRemoved:Delete`,
    /// `LifecycleExpiration:DeleteMarkerCreated`...) or EventBridge's
    /// detail type (`Object Created`, `Object Deleted` and its
    /// `deletion-type`).
    pub fn kind(&self) -> EventKind {
        let name = self.event_name.as_str();
        let marker = self.deletion_type.as_deref() == Some("Delete Marker Created");
        match name {
            _ if name.starts_with("ObjectCreated:")
                || name == "Object Created"
                || name == HAND_ON_EVENT =>
            {
                EventKind::Created
            }
            "ObjectRemoved:Delete" | "LifecycleExpiration:Delete" => EventKind::Removed,
            "ObjectRemoved:DeleteMarkerCreated" | "LifecycleExpiration:DeleteMarkerCreated" => {
                EventKind::DeleteMarker
            }
            "Object Deleted" if marker => EventKind::DeleteMarker,
            "Object Deleted" => EventKind::Removed,
            _ => EventKind::Other,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Created,
    /// The object (unversioned) or one version is gone for good.
    Removed,
    /// A delete marker now hides the key; its versions still exist.
    DeleteMarker,
    Other,
}

/// Why a body is not an S3 notification we can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("body is not JSON: {0}")]
    NotJson(String),
    #[error("body is not an S3 notification: {0}")]
    NotS3(String),
    #[error("record {index}: {problem}")]
    BadRecord { index: usize, problem: String },
}

#[derive(Deserialize)]
struct RawBody {
    #[serde(rename = "Event")]
    event: Option<String>,
    #[serde(rename = "Records")]
    records: Option<Vec<Value>>,
}

#[derive(Deserialize)]
struct RawRecord {
    #[serde(rename = "eventName")]
    event_name: String,
    s3: RawS3,
}

#[derive(Deserialize)]
struct RawS3 {
    bucket: RawBucket,
    object: RawObject,
}

#[derive(Deserialize)]
struct RawBucket {
    name: String,
}

#[derive(Deserialize)]
struct RawObject {
    key: String,
    #[serde(rename = "versionId")]
    version_id: Option<String>,
    #[serde(rename = "eTag")]
    etag: Option<String>,
    size: Option<u64>,
    sequencer: Option<String>,
}

/// An S3 event as EventBridge delivers it (`source: aws.s3`).
#[derive(Deserialize)]
struct RawEventBridge {
    #[serde(rename = "detail-type")]
    detail_type: String,
    detail: RawDetail,
}

#[derive(Deserialize)]
struct RawDetail {
    bucket: RawBucket,
    object: RawDetailObject,
    #[serde(rename = "deletion-type")]
    deletion_type: Option<String>,
}

#[derive(Deserialize)]
struct RawDetailObject {
    key: String,
    #[serde(rename = "version-id")]
    version_id: Option<String>,
    etag: Option<String>,
    size: Option<u64>,
    sequencer: Option<String>,
}

/// Parses one SQS message body. Three shapes reach SQS:
/// - an S3 event notification (S3 → SQS): `{"Records": [...]}`, keys URL-encoded;
/// - the same inside an SNS envelope (S3 → SNS → SQS, raw delivery off):
///   `{"Type": "Notification", "Message": "<the notification as a string>"}`;
/// - an EventBridge event (S3 → EventBridge → SQS): `{"source": "aws.s3",
///   "detail-type": "Object Created", "detail": {...}}`, keys not encoded.
pub fn parse_body(body: &str) -> Result<Notification, BodyError> {
    let value: Value = serde_json::from_str(body).map_err(|e| BodyError::NotJson(e.to_string()))?;
    let object = value.as_object().ok_or_else(|| {
        BodyError::NotS3(format!(
            "the body is {}, not a JSON object",
            json_type(&value)
        ))
    })?;
    if object.get("Type").and_then(Value::as_str) == Some("Notification") {
        let message = object
            .get("Message")
            .and_then(Value::as_str)
            .ok_or_else(|| BodyError::NotS3("SNS envelope without a \"Message\" string".into()))?;
        let inner: Value = serde_json::from_str(message)
            .map_err(|e| BodyError::NotS3(format!("SNS message is not JSON: {e}")))?;
        return parse_notification(inner).map_err(|e| match e {
            BodyError::NotS3(problem) => BodyError::NotS3(format!("SNS message: {problem}")),
            other => other,
        });
    }
    if ExecutionClosed::is_status_change(&value) {
        let closed = ExecutionClosed::from_value(&value).map_err(BodyError::NotS3)?;
        return Ok(Notification::ExecutionClosed(Box::new(closed)));
    }
    if SplitTask::is_task(&value) {
        let task = SplitTask::from_value(value).map_err(BodyError::NotS3)?;
        return Ok(Notification::SplitTask(Box::new(task)));
    }
    if HandOn::is_hand_on(&value) {
        let hand_on = HandOn::from_value(value).map_err(BodyError::NotS3)?;
        return Ok(Notification::Records(vec![S3Record {
            event_name: HAND_ON_EVENT.to_string(),
            bucket: hand_on.bucket,
            key: hand_on.key,
            version_id: non_null_version(hand_on.version_id),
            etag: Some(hand_on.etag),
            size: Some(hand_on.size),
            sequencer: None,
            deletion_type: None,
            handed_on: Some(HandedOn {
                count: hand_on.hand_ons,
                recipes: hand_on.recipes,
                ran: hand_on.ran,
            }),
        }]));
    }
    if object.get("source").and_then(Value::as_str) == Some("aws.s3")
        && object.contains_key("detail-type")
    {
        return parse_eventbridge(value).map(|record| Notification::Records(vec![record]));
    }
    parse_notification(value)
}

fn parse_notification(value: Value) -> Result<Notification, BodyError> {
    if !value.is_object() {
        return Err(BodyError::NotS3(format!(
            "{} is not an S3 notification",
            json_type(&value)
        )));
    }
    let raw: RawBody =
        serde_json::from_value(value).map_err(|e| BodyError::NotS3(e.to_string()))?;
    if raw.event.as_deref() == Some("s3:TestEvent") {
        return Ok(Notification::TestEvent);
    }
    let records = raw
        .records
        .ok_or_else(|| BodyError::NotS3("no \"Records\" array".into()))?;
    if records.is_empty() {
        return Err(BodyError::NotS3("\"Records\" is empty".into()));
    }
    records
        .into_iter()
        .enumerate()
        .map(|(index, value)| {
            parse_record(value).map_err(|problem| BodyError::BadRecord { index, problem })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Notification::Records)
}

fn parse_eventbridge(value: Value) -> Result<S3Record, BodyError> {
    let bad = |problem: String| BodyError::BadRecord { index: 0, problem };
    let raw: RawEventBridge =
        serde_json::from_value(value).map_err(|e| bad(format!("EventBridge event: {e}")))?;
    let (bucket, key) = (raw.detail.bucket.name, raw.detail.object.key);
    if bucket.is_empty() {
        return Err(bad("empty bucket name".into()));
    }
    if key.is_empty() {
        return Err(bad("empty object key".into()));
    }
    Ok(S3Record {
        event_name: raw.detail_type,
        bucket,
        // EventBridge carries the key as it is, not URL-encoded.
        key,
        version_id: non_null_version(raw.detail.object.version_id),
        etag: clean_etag(raw.detail.object.etag),
        size: raw.detail.object.size,
        sequencer: raw.detail.object.sequencer,
        deletion_type: raw.detail.deletion_type,
        handed_on: None,
    })
}

/// S3 writes "null" for objects put before versioning was enabled.
fn non_null_version(version: Option<String>) -> Option<String> {
    version.filter(|v| !v.is_empty() && v != "null")
}

fn clean_etag(etag: Option<String>) -> Option<String> {
    etag.map(|e| e.trim_matches('"').to_string())
        .filter(|e| !e.is_empty())
}

fn parse_record(value: serde_json::Value) -> Result<S3Record, String> {
    let raw: RawRecord = serde_json::from_value(value).map_err(|e| e.to_string())?;
    if raw.s3.bucket.name.is_empty() {
        return Err("empty bucket name".into());
    }
    let key = decode_key(&raw.s3.object.key)?;
    if key.is_empty() {
        return Err("empty object key".into());
    }
    Ok(S3Record {
        event_name: raw.event_name,
        bucket: raw.s3.bucket.name,
        key,
        version_id: non_null_version(raw.s3.object.version_id),
        etag: clean_etag(raw.s3.object.etag),
        size: raw.s3.object.size,
        sequencer: raw.s3.object.sequencer,
        deletion_type: None,
        handed_on: None,
    })
}

/// What S3 percent-encodes in an event's key: all but unreserved
/// characters and `/`.
const EVENT_KEY: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~')
    .remove(b'/');

/// Encodes an object key as S3 writes it in events ([`decode_key`]'s
/// inverse): a message made here reads as S3's own.
pub fn encode_key(key: &str) -> String {
    percent_encoding::utf8_percent_encode(key, EVENT_KEY).to_string()
}

/// The body of the notification S3 sends for an object created: one
/// `ObjectCreated:Put` record, key encoded, with what is known of it.
pub fn created_notification(
    bucket: &str,
    key: &str,
    version_id: Option<&str>,
    etag: Option<&str>,
    size: Option<u64>,
) -> String {
    serde_json::json!({"Records": [{
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "eventName": "ObjectCreated:Put",
        "s3": {
            "s3SchemaVersion": "1.0",
            "bucket": {"name": bucket, "arn": format!("arn:aws:s3:::{bucket}")},
            "object": {"key": encode_key(key), "versionId": version_id, "eTag": etag, "size": size},
        },
    }]})
    .to_string()
}

/// The body of the notification S3 sends for an object deleted for good
/// (`ObjectRemoved:Delete`), key encoded.
pub fn removed_notification(bucket: &str, key: &str, version_id: Option<&str>) -> String {
    serde_json::json!({"Records": [{
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "eventName": "ObjectRemoved:Delete",
        "s3": {
            "s3SchemaVersion": "1.0",
            "bucket": {"name": bucket, "arn": format!("arn:aws:s3:::{bucket}")},
            "object": {"key": encode_key(key), "versionId": version_id},
        },
    }]})
    .to_string()
}

/// The body of the notification S3 sends for a DELETE that puts a delete
/// marker (`ObjectRemoved:DeleteMarkerCreated`): in a versioned bucket the
/// marker's version id; in a versioning-suspended one `null` (the null
/// version removed for good and a null marker put).
pub fn marker_notification(bucket: &str, key: &str, marker_version_id: &str) -> String {
    serde_json::json!({"Records": [{
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "eventName": "ObjectRemoved:DeleteMarkerCreated",
        "s3": {
            "s3SchemaVersion": "1.0",
            "bucket": {"name": bucket, "arn": format!("arn:aws:s3:::{bucket}")},
            "object": {"key": encode_key(key), "versionId": marker_version_id},
        },
    }]})
    .to_string()
}

/// Decodes an object key as S3 writes it in events: form-style, so `+` is a
/// space, then percent-decoding. A literal `+` arrives as `%2B`.
pub fn decode_key(encoded: &str) -> Result<String, String> {
    let spaced = encoded.replace('+', " ");
    let bytes: Vec<u8> = percent_encoding::percent_decode_str(&spaced).collect();
    String::from_utf8(bytes).map_err(|_| format!("object key {encoded:?} decodes to invalid UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put_body(key: &str) -> String {
        serde_json::json!({"Records": [{
            "eventVersion": "2.1", "eventSource": "aws:s3", "eventName": "ObjectCreated:Put",
            "s3": {"bucket": {"name": "in"}, "object": {"key": key, "size": 3, "eTag": "abc"}}
        }]})
        .to_string()
    }

    #[test]
    fn removals_are_told_from_delete_markers() {
        let record = |name: &str, deletion: Option<&str>| S3Record {
            event_name: name.into(),
            deletion_type: deletion.map(str::to_string),
            ..Default::default()
        };
        for (name, kind) in [
            ("ObjectCreated:CompleteMultipartUpload", EventKind::Created),
            ("ObjectRemoved:Delete", EventKind::Removed),
            ("LifecycleExpiration:Delete", EventKind::Removed),
            ("ObjectRemoved:DeleteMarkerCreated", EventKind::DeleteMarker),
            ("LifecycleExpiration:DeleteMarkerCreated", EventKind::DeleteMarker),
            ("ObjectRestore:Completed", EventKind::Other),
            ("Object Created", EventKind::Created),
        ] {
            assert_eq!(record(name, None).kind(), kind, "{name}");
        }
        assert_eq!(
            record("Object Deleted", Some("Permanently Deleted")).kind(),
            EventKind::Removed
        );
        assert_eq!(
            record("Object Deleted", Some("Delete Marker Created")).kind(),
            EventKind::DeleteMarker
        );
    }

    #[test]
    fn keys_encode_as_s3_writes_them_and_decode_back() {
        for key in ["a b+c.jpg", "café/ü ß.png", "x~y_z-1.2", "%41", "q?r#s&t"] {
            assert_eq!(decode_key(&encode_key(key)).unwrap(), key);
        }
        assert_eq!(encode_key("a b+c/d.jpg"), "a%20b%2Bc/d.jpg");
        let body = created_notification("in", "a b.jpg", Some("v1"), Some("abc"), Some(3));
        let Notification::Records(records) = parse_body(&body).unwrap() else {
            panic!("expected records");
        };
        assert_eq!(records[0].key, "a b.jpg");
        assert_eq!(records[0].version_id.as_deref(), Some("v1"));
        assert_eq!(records[0].kind(), EventKind::Created);
    }

    #[test]
    fn decodes_plus_as_space_and_percent_escapes() {
        assert_eq!(decode_key("a+b%2Bc%20d").unwrap(), "a b+c d");
        assert_eq!(decode_key("caf%C3%A9").unwrap(), "café");
        assert!(decode_key("%FF").unwrap_err().contains("invalid UTF-8"));
    }

    #[test]
    fn parses_a_minimal_record_without_version_or_identity() {
        let Notification::Records(records) = parse_body(&put_body("photos/my+cat.jpg")).unwrap()
        else {
            panic!("expected records");
        };
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].key, "photos/my cat.jpg");
        assert_eq!(records[0].version_id, None);
        assert_eq!(records[0].etag.as_deref(), Some("abc"));
        assert_eq!(records[0].kind(), EventKind::Created);
    }

    #[test]
    fn recognises_the_test_event() {
        let body = r#"{"Service":"Amazon S3","Event":"s3:TestEvent","Time":"2026-01-01T00:00:00.000Z","Bucket":"in"}"#;
        assert_eq!(parse_body(body).unwrap(), Notification::TestEvent);
    }

    #[test]
    fn errors_name_what_was_wrong() {
        assert!(matches!(
            parse_body("{not json"),
            Err(BodyError::NotJson(_))
        ));
        assert_eq!(
            parse_body("{}"),
            Err(BodyError::NotS3("no \"Records\" array".into()))
        );
        assert_eq!(
            parse_body(r#"{"Records": []}"#),
            Err(BodyError::NotS3("\"Records\" is empty".into()))
        );
        let missing_key = r#"{"Records":[{"eventName":"ObjectCreated:Put","s3":{"bucket":{"name":"b"},"object":{}}}]}"#;
        match parse_body(missing_key) {
            Err(BodyError::BadRecord { index: 0, problem }) => {
                assert!(problem.contains("key"), "{problem}")
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(parse_body("[1,2]"), Err(BodyError::NotS3(_))));
    }

    #[test]
    fn unwraps_an_sns_envelope() {
        let envelope = serde_json::json!({
            "Type": "Notification",
            "MessageId": "m",
            "TopicArn": "arn:aws:sns:us-east-1:123456789012:uploads",
            "Subject": "Amazon S3 Notification",
            "Message": put_body("a%20b.png"),
        })
        .to_string();
        let Notification::Records(records) = parse_body(&envelope).unwrap() else {
            panic!("expected records");
        };
        assert_eq!(records[0].key, "a b.png");
        let not_s3 =
            serde_json::json!({"Type": "Notification", "Message": "{\"alarm\": true}"}).to_string();
        match parse_body(&not_s3) {
            Err(BodyError::NotS3(problem)) => {
                assert!(problem.starts_with("SNS message: "), "{problem}")
            }
            other => panic!("{other:?}"),
        }
        let test_event =
            serde_json::json!({"Type": "Notification", "Message": "{\"Event\":\"s3:TestEvent\"}"})
                .to_string();
        assert_eq!(parse_body(&test_event), Ok(Notification::TestEvent));
    }

    #[test]
    fn reads_an_eventbridge_event_whose_key_is_not_encoded() {
        let event = serde_json::json!({
            "version": "0", "id": "e", "detail-type": "Object Created", "source": "aws.s3",
            "account": "123456789012", "time": "2026-12-02T12:00:00Z", "region": "us-east-1",
            "resources": ["arn:aws:s3:::in"],
            "detail": {"version": "0", "bucket": {"name": "in"},
                       "object": {"key": "a+b%20c.png", "size": 5, "etag": "abc", "version-id": "v1", "sequencer": "1"},
                       "request-id": "r", "requester": "123456789012", "reason": "PutObject"}
        })
        .to_string();
        let Notification::Records(records) = parse_body(&event).unwrap() else {
            panic!("expected records");
        };
        assert_eq!(records[0].key, "a+b%20c.png");
        assert_eq!(records[0].version_id.as_deref(), Some("v1"));
        assert_eq!(records[0].kind(), EventKind::Created);
        let deleted = event.replace("Object Created", "Object Deleted");
        let Notification::Records(records) = parse_body(&deleted).unwrap() else {
            panic!()
        };
        assert_eq!(records[0].kind(), EventKind::Removed);
    }

    #[test]
    fn removed_and_other_events_are_classified() {
        let body = put_body("k").replace("ObjectCreated:Put", "ObjectRemoved:Delete");
        let Notification::Records(records) = parse_body(&body).unwrap() else {
            panic!()
        };
        assert_eq!(records[0].kind(), EventKind::Removed);
        let body = put_body("k").replace("ObjectCreated:Put", "ObjectRestore:Completed");
        let Notification::Records(records) = parse_body(&body).unwrap() else {
            panic!()
        };
        assert_eq!(records[0].kind(), EventKind::Other);
    }
}
