//! The queue: handing a busy message back for when its holder's lease
//! ends, and handing a version's pipeline on to another invocation.
//!
//! A busy message would otherwise come back after the queue's whole
//! visibility timeout (at least 6x the function timeout), often far later
//! than the holder needs.
//!
//! Every message mediaonce sends ([`Outgoing`]) names its message group
//! (the object it is about; a chunk, its own) and what caused it. Sent to
//! a FIFO queue (`.fifo`), the group is its `MessageGroupId` (one object's
//! messages stay in order, as its notifications are when they come
//! through a FIFO queue) and the SHA-256 of its cause and body its
//! `MessageDeduplicationId`: a send repeated within SQS's five minutes
//! (the SDK retrying one whose answer was lost) is one message, and two
//! messages with one body but different causes (a version handed on by a
//! walk, then again by a split's end) are both delivered.

use std::sync::Arc;
use std::time::Duration;

use crate::aws::describe_error;

/// Bounds on a busy message's new visibility timeout: SQS allows 0 to 12 h,
/// and less than 2 s would only spin.
pub const MIN_BUSY_DELAY: Duration = Duration::from_secs(2);
pub const MAX_BUSY_DELAY: Duration = Duration::from_secs(12 * 60 * 60);

/// The visibility timeout, in whole seconds, that brings a message back when
/// a lease ending at `lease_until_ms` has passed, plus `jitter_ms` so that
/// many waiters do not return at once. Pure.
pub fn busy_delay_secs(lease_until_ms: u64, now_ms: u64, jitter_ms: u64) -> i32 {
    let wait_ms = lease_until_ms
        .saturating_sub(now_ms)
        .saturating_add(jitter_ms);
    let secs = wait_ms.div_ceil(1_000);
    secs.clamp(MIN_BUSY_DELAY.as_secs(), MAX_BUSY_DELAY.as_secs()) as i32
}

/// The queue URL of an SQS queue ARN (`arn:<partition>:sqs:<region>:<account>:<name>`).
pub fn queue_url_from_arn(arn: &str) -> Option<String> {
    let mut parts = arn.split(':');
    let (Some("arn"), Some(partition), Some("sqs"), Some(region), Some(account), Some(name), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return None;
    };
    if region.is_empty() || account.is_empty() || name.is_empty() {
        return None;
    }
    let domain = match partition {
        "aws-cn" => "amazonaws.com.cn",
        _ => "amazonaws.com",
    };
    Some(format!("https://sqs.{region}.{domain}/{account}/{name}"))
}

#[derive(Debug, thiserror::Error)]
#[error("ChangeMessageVisibility on {queue_url} failed: {message}")]
pub struct DelayError {
    pub queue_url: String,
    pub message: String,
}

/// Whether a queue URL (or ARN) names a FIFO queue.
pub fn is_fifo_queue(queue: &str) -> bool {
    queue.ends_with(".fifo")
}

/// SQS's longest `MessageGroupId`.
const MAX_GROUP_ID: usize = 128;

/// The FIFO message group of the messages about `bucket`/`key`: the
/// object's name itself when SQS accepts it as a group id (at most 128
/// characters, ASCII letters, digits and punctuation), else `sha256:` and
/// the SHA-256 of the name (an S3 key may be 1,024 bytes of any UTF-8).
/// One object always gets the same group. Pure.
pub fn message_group(bucket: &str, key: &str) -> String {
    let name = format!("{bucket}/{key}");
    if name.len() <= MAX_GROUP_ID && name.bytes().all(|b| b.is_ascii_graphic()) {
        name
    } else {
        format!("sha256:{}", crate::key::sha256_hex(name.as_bytes()))
    }
}

/// The `MessageDeduplicationId` of a message sent to a FIFO queue: the
/// SHA-256 of what caused it and its body. Pure.
pub fn deduplication_id(cause: &str, body: &str) -> String {
    crate::key::sha256_hex(format!("{cause}\n{body}").as_bytes())
}

/// A message mediaonce sends.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    pub body: &'a str,
    /// Its FIFO message group ([`message_group`]).
    pub group: &'a str,
    /// What caused it (the message that walked, a split's owner): with
    /// the body, its FIFO deduplication id.
    pub cause: &'a str,
}

#[derive(Debug, thiserror::Error)]
#[error("SendMessage to {queue_url} failed: {message}")]
pub struct SendError {
    pub queue_url: String,
    pub message: String,
}

/// The queue calls mediaonce makes.
#[async_trait::async_trait]
pub trait QueueClient: Send + Sync + std::fmt::Debug {
    /// SendMessage: a new message on the queue.
    async fn send(&self, queue_url: &str, message: &Outgoing<'_>) -> Result<(), SendError>;

    /// ChangeMessageVisibility: the received message is visible again in `seconds`.
    async fn change_visibility(
        &self,
        queue_url: &str,
        receipt_handle: &str,
        seconds: i32,
    ) -> Result<(), DelayError>;
}

/// The queue client the handler uses.
#[derive(Debug, Clone)]
pub struct Queue {
    client: Arc<dyn QueueClient>,
}

impl Queue {
    pub fn new(client: impl QueueClient + 'static) -> Self {
        Queue {
            client: Arc::new(client),
        }
    }

    /// The queue in SQS.
    pub fn sqs(client: aws_sdk_sqs::Client) -> Self {
        Queue::new(SqsQueue { client })
    }

    /// Sends a new message.
    pub async fn send(&self, queue_url: &str, message: &Outgoing<'_>) -> Result<(), SendError> {
        self.client.send(queue_url, message).await
    }

    /// Makes a received message visible again in `seconds`.
    pub async fn delay(
        &self,
        queue_url: &str,
        receipt_handle: &str,
        seconds: i32,
    ) -> Result<(), DelayError> {
        self.client
            .change_visibility(queue_url, receipt_handle, seconds)
            .await
    }
}

/// SQS.
#[derive(Debug, Clone)]
pub struct SqsQueue {
    client: aws_sdk_sqs::Client,
}

#[async_trait::async_trait]
impl QueueClient for SqsQueue {
    async fn send(&self, queue_url: &str, message: &Outgoing<'_>) -> Result<(), SendError> {
        let mut request = self
            .client
            .send_message()
            .queue_url(queue_url)
            .message_body(message.body);
        if is_fifo_queue(queue_url) {
            request = request
                .message_group_id(message.group)
                .message_deduplication_id(deduplication_id(message.cause, message.body));
        }
        request.send().await.map(|_| ()).map_err(|err| SendError {
            queue_url: queue_url.to_string(),
            message: describe_error(&err),
        })
    }

    async fn change_visibility(
        &self,
        queue_url: &str,
        receipt_handle: &str,
        seconds: i32,
    ) -> Result<(), DelayError> {
        self.client
            .change_message_visibility()
            .queue_url(queue_url)
            .receipt_handle(receipt_handle)
            .visibility_timeout(seconds)
            .send()
            .await
            .map(|_| ())
            .map_err(|err| DelayError {
                queue_url: queue_url.to_string(),
                message: describe_error(&err),
            })
    }
}

/// A queue that records the visibility changes and the messages asked of
/// it (unit tests, local runs without a queue).
#[derive(Debug, Default)]
pub struct RecordingQueue {
    changes: std::sync::Mutex<Vec<(String, String, i32)>>,
    sent: std::sync::Mutex<Vec<(String, String)>>,
    groups: std::sync::Mutex<Vec<String>>,
}

impl RecordingQueue {
    /// The (queue URL, body) of every message sent so far.
    pub fn sent(&self) -> Vec<(String, String)> {
        self.sent.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The (queue URL, body) of every message sent since the last call:
    /// what a simulated queue delivers next.
    pub fn take_sent(&self) -> Vec<(String, String)> {
        std::mem::take(&mut *self.sent.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The message group of every message sent, in order.
    pub fn groups(&self) -> Vec<String> {
        self.groups
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The delay last asked for the message received as `receipt_handle`.
    pub fn delay_of(&self, receipt_handle: &str) -> Option<i32> {
        self.changes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .rev()
            .find(|(_, handle, _)| handle == receipt_handle)
            .map(|(_, _, seconds)| *seconds)
    }

    /// The (queue URL, receipt handle, seconds) asked so far.
    pub fn changes(&self) -> Vec<(String, String, i32)> {
        self.changes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[async_trait::async_trait]
impl QueueClient for Arc<RecordingQueue> {
    async fn send(&self, queue_url: &str, message: &Outgoing<'_>) -> Result<(), SendError> {
        self.sent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((queue_url.to_string(), message.body.to_string()));
        self.groups
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(message.group.to_string());
        Ok(())
    }

    async fn change_visibility(
        &self,
        queue_url: &str,
        receipt_handle: &str,
        seconds: i32,
    ) -> Result<(), DelayError> {
        self.changes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((queue_url.to_string(), receipt_handle.to_string(), seconds));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_recording_queue_answers_the_last_delay_of_a_message() {
        let recorded = Arc::new(RecordingQueue::default());
        let queue = Queue::new(recorded.clone());
        queue.delay("q", "r-1", 30).await.unwrap();
        queue.delay("q", "r-2", 5).await.unwrap();
        queue.delay("q", "r-1", 12).await.unwrap();
        assert_eq!(recorded.delay_of("r-1"), Some(12));
        assert_eq!(recorded.delay_of("r-2"), Some(5));
        assert_eq!(recorded.delay_of("r-3"), None);
        assert_eq!(recorded.changes().len(), 3);
    }

    #[test]
    fn delay_reaches_past_the_lease_within_bounds() {
        assert_eq!(busy_delay_secs(10_000, 0, 0), 10);
        assert_eq!(
            busy_delay_secs(10_001, 0, 0),
            11,
            "rounded up: never before the lease ends"
        );
        assert_eq!(busy_delay_secs(10_000, 0, 900), 11);
        assert_eq!(
            busy_delay_secs(0, 5_000, 0),
            2,
            "a passed lease: the minimum"
        );
        assert_eq!(busy_delay_secs(u64::MAX, 0, 0), 43_200, "at most 12 h");
    }

    #[test]
    fn an_object_is_one_message_group_that_sqs_accepts() {
        assert_eq!(message_group("in", "videos/a.mp4"), "in/videos/a.mp4");
        for key in ["a b.mp4", "vidéo.mp4", &"k".repeat(200)] {
            let group = message_group("in", key);
            assert!(group.starts_with("sha256:") && group.len() == 71, "{group}");
            assert!(group.bytes().all(|b| b.is_ascii_graphic()));
            assert_eq!(group, message_group("in", key), "the same every time");
        }
        assert_ne!(message_group("in", "a b"), message_group("in2", "a b"));
        assert!(is_fifo_queue("https://sqs.r.amazonaws.com/1/jobs.fifo"));
        assert!(!is_fifo_queue("https://sqs.r.amazonaws.com/1/jobs"));
        assert_eq!(deduplication_id("m1", "x").len(), 64);
        assert_ne!(deduplication_id("m1", "x"), deduplication_id("m2", "x"));
    }

    #[test]
    fn queue_urls_from_arns() {
        assert_eq!(
            queue_url_from_arn("arn:aws:sqs:eu-west-1:123456789012:jobs").as_deref(),
            Some("https://sqs.eu-west-1.amazonaws.com/123456789012/jobs")
        );
        assert_eq!(
            queue_url_from_arn("arn:aws-cn:sqs:cn-north-1:123456789012:jobs.fifo").as_deref(),
            Some("https://sqs.cn-north-1.amazonaws.com.cn/123456789012/jobs.fifo")
        );
        for bad in [
            "",
            "arn:aws:s3:::bucket",
            "arn:aws:sqs:eu-west-1:123",
            "arn:aws:sqs:r:a:n:extra",
        ] {
            assert_eq!(queue_url_from_arn(bad), None, "{bad}");
        }
    }
}
