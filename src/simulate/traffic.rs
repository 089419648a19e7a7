//! The month's uploads and the notifications they cause, generated as the
//! virtual clock reaches them.

use std::sync::Arc;

use aws_lambda_events::event::sqs::SqsMessage;

use super::{SimOptions, BUCKET};
use crate::store::memory::InMemoryObjects;

const MONTH_MS: u64 = 30 * 24 * 3_600_000;
/// S3 notifies within about a second.
const NOTIFY_MS: u64 = 500;
/// A duplicate notification comes within seconds of the first.
const DUPLICATE_WITHIN_MS: u64 = 5_000;
/// A user presses "reprocess" within a day.
const CLICK_WITHIN_MS: u64 = 24 * 3_600_000;

/// One message, at the time it becomes visible.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub at_ms: u64,
    pub message_id: String,
    body: Arc<str>,
}

impl Delivery {
    /// A message the handler sent (a chunk, a hand-on), delivered at `at_ms`.
    pub fn sent(at_ms: u64, message_id: String, body: &str) -> Self {
        Delivery {
            at_ms,
            message_id,
            body: body.into(),
        }
    }

    /// The message as the event source mapping hands it to the function.
    pub fn message(&self, receipt: u64, queue_arn: &str) -> SqsMessage {
        let mut message = SqsMessage::default();
        message.message_id = Some(self.message_id.clone());
        message.receipt_handle = Some(format!("receipt-{receipt}"));
        message.body = Some(self.body.to_string());
        message.event_source_arn = Some(queue_arn.to_string());
        message
    }
}

/// The uploads, one at a time, spread evenly over the month.
pub struct Traffic {
    options: SimOptions,
    start_ms: u64,
    next: u64,
    /// The content of every upload so far: drawing an earlier upload
    /// uniformly makes a content uploaded k times k times as likely to be
    /// uploaded again (a few contents are uploaded many times).
    contents_by_upload: Vec<u32>,
    contents: u32,
    rng: fastrand::Rng,
}

impl Traffic {
    pub fn new(options: &SimOptions, start_ms: u64) -> Self {
        Traffic {
            options: options.clone(),
            start_ms,
            next: 0,
            contents_by_upload: Vec::with_capacity(options.uploads as usize),
            contents: 0,
            rng: fastrand::Rng::with_seed(options.seed),
        }
    }

    pub fn unique_contents(&self) -> u64 {
        u64::from(self.contents)
    }

    /// The next upload's deliveries, if it happens at or before `limit_ms`
    /// (any time when `None`); its object is put in `objects` first.
    pub fn next_before(
        &mut self,
        limit_ms: Option<u64>,
        objects: &InMemoryObjects,
    ) -> Option<Vec<Delivery>> {
        if self.next >= self.options.uploads {
            return None;
        }
        let at_ms = self.start_ms + self.next * MONTH_MS / self.options.uploads.max(1);
        if limit_ms.is_some_and(|limit| at_ms > limit) {
            return None;
        }
        let upload = self.next;
        self.next += 1;
        let content =
            if !self.contents_by_upload.is_empty() && self.rng.f64() < self.options.identical {
                self.contents_by_upload[self.rng.usize(0..self.contents_by_upload.len())]
            } else {
                self.contents += 1;
                self.contents - 1
            };
        self.contents_by_upload.push(content);
        let key = format!("u/{upload}.mp4");
        let bytes = format!("the bytes of content {content}");
        let etag = objects.insert(BUCKET, &key, bytes.as_bytes(), true);
        let body: Arc<str> = serde_json::json!({"Records": [{
            "eventSource": "aws:s3",
            "eventName": "ObjectCreated:Put",
            "s3": {
                "bucket": {"name": BUCKET},
                "object": {"key": key, "size": bytes.len(), "eTag": etag, "sequencer": format!("{upload:016X}")}
            }
        }]})
        .to_string()
        .into();
        let delivery = |at_ms: u64, message_id: String| Delivery {
            at_ms,
            message_id,
            body: body.clone(),
        };
        let mut deliveries = vec![delivery(at_ms + NOTIFY_MS, format!("m-{upload}"))];
        if self.rng.f64() < self.options.s3_duplicates {
            let at = at_ms + NOTIFY_MS + self.rng.u64(0..DUPLICATE_WITHIN_MS);
            deliveries.push(delivery(at, format!("m-{upload}-duplicate")));
        }
        if self.rng.f64() < self.options.reprocess_clicks {
            let at = at_ms + self.rng.u64(60_000..CLICK_WITHIN_MS);
            deliveries.push(delivery(at, format!("m-{upload}-click")));
        }
        Some(deliveries)
    }
}
