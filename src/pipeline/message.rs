//! The hand-on message: an uploaded object version whose pipeline goes on
//! in another invocation. Sent to the job queue (the queue the upload's
//! notification came from) when jobs downstream of done ones have no time
//! left in this invocation; its receiver walks the version's pipeline
//! again, reusing every done job and running the rest. Pure.
//!
//! ```json
//! {"mediaonce": "pipeline/1", "bucket": "uploads", "key": "videos/a.mp4",
//!  "versionId": "3HL4kqtJlcpXroDTDmJ.rmSpXd3dIbrHY", "eTag": "9b2cf535f27731c974343645a3985328",
//!  "size": 52428800, "recipes": ["poster-thumbs"], "handOns": 1}
//! ```
//!
//! `versionId` is `null` in an unversioned bucket; `recipes` names the
//! recipes handed on (for logs: the receiver walks the whole pipeline);
//! `handOns` counts the hand-ons of the version's pipeline up to this one
//! (a message from before it had none: 1). A duplicate is harmless: its
//! jobs are claimed like any other.
//!
//! Hand-ons form a chain, never a tree: a message sends one only when it
//! is acknowledged (a message that comes back hands nothing on: its
//! redelivery walks the pipeline again), and at [`MAX_HAND_ONS`] the jobs
//! it would hand on are refused for good, so a pipeline that never gets
//! its time ends with its failure event (DESIGN.md, "Pipelines").

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The field, and its value, that mark a body as a hand-on message.
pub const HAND_ON_MARKER: (&str, &str) = ("mediaonce", "pipeline/1");

/// The most hand-ons of one version's pipeline. Each goes to a fresh
/// invocation, which has its whole timeout for the jobs handed on (a job
/// that needs more is refused for good), so a pipeline needs about one per
/// level; past this many, the jobs it would hand on are refused for good
/// (`poisoned`), and its failure event ends it.
pub const MAX_HAND_ONS: u32 = 20;

/// One object version's pipeline, handed on. Fields it does not know are
/// ignored, not refused: a message written by a later release (a field
/// added, as `handOns` was) stays readable by an earlier one during a
/// rollback, instead of coming back until it is dead-lettered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HandOn {
    /// Always [`HAND_ON_MARKER`]'s value.
    pub mediaonce: String,
    pub bucket: String,
    pub key: String,
    pub version_id: Option<String>,
    /// The ETag of the bytes the pipeline was keyed on, unquoted: a
    /// version that holds other bytes now runs nothing for this message.
    #[serde(rename = "eTag")]
    pub etag: String,
    pub size: u64,
    pub recipes: Vec<String>,
    /// The hand-ons of the version's pipeline, this one included.
    #[serde(default = "one")]
    pub hand_ons: u32,
    /// The job a split's execution ran for this version (the upload whose
    /// delivery started it): its walk reports the job `ran`, not reused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ran: Option<String>,
}

fn one() -> u32 {
    1
}

impl HandOn {
    pub fn new(
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        etag: &str,
        size: u64,
        recipes: Vec<String>,
        hand_ons: u32,
    ) -> Self {
        HandOn {
            mediaonce: HAND_ON_MARKER.1.to_string(),
            bucket: bucket.to_string(),
            key: key.to_string(),
            version_id: version_id.map(str::to_string),
            etag: etag.to_string(),
            size,
            recipes,
            hand_ons,
            ran: None,
        }
    }

    /// The same, for the version whose delivery started the split that
    /// ran `job_key`.
    pub fn that_ran(mut self, job_key: &str) -> Self {
        self.ran = Some(job_key.to_string());
        self
    }

    /// Whether a body (parsed) is one of ours: it has the marker field.
    pub fn is_hand_on(body: &Value) -> bool {
        body.get(HAND_ON_MARKER.0).is_some()
    }

    /// The message in a body marked as one, or why it is not usable.
    pub fn from_value(body: Value) -> Result<HandOn, String> {
        let hand_on: HandOn = serde_json::from_value(body)
            .map_err(|e| format!("a mediaonce hand-on message that does not parse: {e}"))?;
        if hand_on.mediaonce != HAND_ON_MARKER.1 {
            return Err(format!(
                "a mediaonce message of kind {:?}, not {:?}",
                hand_on.mediaonce, HAND_ON_MARKER.1
            ));
        }
        if hand_on.bucket.is_empty() || hand_on.key.is_empty() || hand_on.etag.is_empty() {
            return Err("a hand-on message needs a bucket, a key and an eTag".into());
        }
        Ok(hand_on)
    }

    /// The SQS message body.
    pub fn to_body(&self) -> String {
        serde_json::to_string(self).expect("a hand-on message serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sample SQS event whose one message is a hand-on.
    const FIXTURE: &str = include_str!("../../events/hand-on.json");

    #[test]
    fn the_documented_fixture_round_trips() {
        let event: Value = serde_json::from_str(FIXTURE).unwrap();
        let body = event["Records"][0]["body"].as_str().unwrap();
        let value: Value = serde_json::from_str(body).unwrap();
        assert!(HandOn::is_hand_on(&value));
        let hand_on = HandOn::from_value(value.clone()).unwrap();
        assert_eq!(hand_on.key, "videos/a.mp4");
        assert_eq!(hand_on.recipes, ["poster-thumbs"]);
        assert_eq!(hand_on.hand_ons, 1);
        let again: Value = serde_json::from_str(&hand_on.to_body()).unwrap();
        assert_eq!(again, value);
    }

    #[test]
    fn an_unversioned_object_has_a_null_version() {
        let hand_on = HandOn::new("b", "k", None, "e", 3, vec![], 1);
        let body: Value = serde_json::from_str(&hand_on.to_body()).unwrap();
        assert_eq!(body["versionId"], Value::Null);
        assert_eq!(HandOn::from_value(body).unwrap(), hand_on);
    }

    #[test]
    fn a_hand_on_from_a_later_release_is_read() {
        let later = serde_json::json!({"mediaonce": "pipeline/1", "bucket": "b", "key": "k",
            "versionId": null, "eTag": "e", "size": 1, "recipes": ["x"], "handOns": 2,
            "aFieldFromLater": true});
        assert_eq!(HandOn::from_value(later).unwrap().hand_ons, 2);
    }

    #[test]
    fn a_hand_on_from_before_the_count_is_the_first() {
        let old = serde_json::json!({"mediaonce": "pipeline/1", "bucket": "b", "key": "k",
            "versionId": null, "eTag": "e", "size": 1, "recipes": ["x"]});
        assert_eq!(HandOn::from_value(old).unwrap().hand_ons, 1);
    }

    #[test]
    fn bad_messages_say_what_is_wrong() {
        let other_kind = serde_json::json!({"mediaonce": "chunk/9", "bucket": "b", "key": "k",
            "versionId": null, "eTag": "e", "size": 1, "recipes": []});
        assert!(HandOn::from_value(other_kind)
            .unwrap_err()
            .contains("\"chunk/9\""));
        let missing = serde_json::json!({"mediaonce": "pipeline/1", "bucket": "b"});
        assert!(HandOn::from_value(missing)
            .unwrap_err()
            .contains("does not parse"));
        let empty = HandOn::new("b", "", None, "e", 1, vec![], 1);
        let value = serde_json::to_value(&empty).unwrap();
        assert!(HandOn::from_value(value)
            .unwrap_err()
            .contains("needs a bucket"));
        assert!(!HandOn::is_hand_on(&serde_json::json!({"Records": []})));
    }
}
