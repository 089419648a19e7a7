//! Parsing the body of an SQS message that S3 sent. Pure: no I/O.
//!
//! Parsing is lenient about fields we do not use (moto omits `userIdentity`
//! and `versionId`, LocalStack omits others) and strict about the ones we do:
//! a record without a bucket name or object key is an error that names it.

use serde::Deserialize;

/// What one SQS message body holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Notification {
    /// `s3:TestEvent`, sent when a notification configuration is saved.
    TestEvent,
    /// One or more S3 event records.
    Records(Vec<S3Record>),
}

/// The part of an S3 event record that mediaonce uses.
#[derive(Debug, Clone, PartialEq)]
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
}

impl S3Record {
    pub fn kind(&self) -> EventKind {
        if self.event_name.starts_with("ObjectCreated:") {
            EventKind::Created
        } else if self.event_name.starts_with("ObjectRemoved:") {
            EventKind::Removed
        } else {
            EventKind::Other
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Created,
    Removed,
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
    records: Option<Vec<serde_json::Value>>,
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
}

/// Parses one SQS message body.
pub fn parse_body(body: &str) -> Result<Notification, BodyError> {
    let raw: RawBody = serde_json::from_str(body).map_err(|e| {
        if serde_json::from_str::<serde_json::Value>(body).is_ok() {
            BodyError::NotS3(e.to_string())
        } else {
            BodyError::NotJson(e.to_string())
        }
    })?;
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
        // S3 writes "null" for objects put before versioning was enabled.
        version_id: raw
            .s3
            .object
            .version_id
            .filter(|v| !v.is_empty() && v != "null"),
        etag: raw
            .s3
            .object
            .etag
            .map(|e| e.trim_matches('"').to_string())
            .filter(|e| !e.is_empty()),
        size: raw.s3.object.size,
    })
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
