//! The event bus: completion events published to EventBridge
//! (`MEDIAONCE_EVENT_BUS`), one PutEvents entry each. Behind a trait, with
//! a recording twin for tests and local runs; the wrapper counts what was
//! published and what failed, for the batch's metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::aws::describe_error;

/// One event to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusEvent {
    /// The bus's name or ARN.
    pub bus: String,
    pub source: String,
    pub detail_type: String,
    /// The detail, a JSON object as text.
    pub detail: String,
    /// ARNs the event concerns (the uploaded object).
    pub resources: Vec<String>,
}

/// EventBridge's largest PutEvents entry, in bytes ([`BusEvent::entry_size`]).
pub const MAX_ENTRY_BYTES: usize = 256 * 1024;

impl BusEvent {
    /// Its size as PutEvents counts it against an entry's limit: source,
    /// detail type, detail and resources in UTF-8 bytes, and 14 bytes for
    /// the time EventBridge gives it.
    pub fn entry_size(&self) -> usize {
        14 + self.source.len()
            + self.detail_type.len()
            + self.detail.len()
            + self.resources.iter().map(String::len).sum::<usize>()
    }
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("PutEvents to {bus} failed: {message}")]
pub struct PublishError {
    pub bus: String,
    pub message: String,
}

/// The bus call mediaonce makes.
#[async_trait::async_trait]
pub trait BusClient: Send + Sync + std::fmt::Debug {
    /// PutEvents with one entry: `Ok` only when the entry was accepted.
    async fn put_event(&self, event: &BusEvent) -> Result<(), PublishError>;
}

/// The bus client the handler uses, counting its calls.
#[derive(Debug, Clone)]
pub struct Bus {
    client: Arc<dyn BusClient>,
    published: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
}

impl Bus {
    pub fn new(client: impl BusClient + 'static) -> Self {
        Bus {
            client: Arc::new(client),
            published: Arc::default(),
            failed: Arc::default(),
        }
    }

    /// EventBridge.
    pub fn eventbridge(client: aws_sdk_eventbridge::Client) -> Self {
        Bus::new(EventBridgeBus { client })
    }

    pub async fn publish(&self, event: &BusEvent) -> Result<(), PublishError> {
        let result = self.client.put_event(event).await;
        let counter = if result.is_ok() {
            &self.published
        } else {
            &self.failed
        };
        counter.fetch_add(1, Ordering::Relaxed);
        result
    }

    /// Events published, and publications that failed, so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.published.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}

/// EventBridge.
#[derive(Debug, Clone)]
pub struct EventBridgeBus {
    client: aws_sdk_eventbridge::Client,
}

#[async_trait::async_trait]
impl BusClient for EventBridgeBus {
    async fn put_event(&self, event: &BusEvent) -> Result<(), PublishError> {
        let failed = |message: String| PublishError {
            bus: event.bus.clone(),
            message,
        };
        let entry = aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
            .event_bus_name(&event.bus)
            .source(&event.source)
            .detail_type(&event.detail_type)
            .detail(&event.detail)
            .set_resources(Some(event.resources.clone()))
            .build();
        let output = self
            .client
            .put_events()
            .entries(entry)
            .send()
            .await
            .map_err(|err| failed(describe_error(&err)))?;
        // PutEvents answers 200 with per-entry failures.
        if output.failed_entry_count() > 0 {
            let why = output
                .entries()
                .iter()
                .find_map(|e| {
                    e.error_code()
                        .map(|code| format!("{code}: {}", e.error_message().unwrap_or_default()))
                })
                .unwrap_or_else(|| "the entry was not accepted".into());
            return Err(failed(why));
        }
        Ok(())
    }
}

/// A bus that records what is published (tests, local runs); it refuses
/// every event while [`RecordingBus::refuse`] is set.
#[derive(Debug, Default)]
pub struct RecordingBus {
    events: Mutex<Vec<BusEvent>>,
    refusing: Mutex<Option<String>>,
}

impl RecordingBus {
    pub fn events(&self) -> Vec<BusEvent> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Refuses every event with `why` from now on (`None`: accepts again).
    pub fn refuse(&self, why: Option<&str>) {
        *self.refusing.lock().unwrap_or_else(|p| p.into_inner()) = why.map(str::to_string);
    }
}

#[async_trait::async_trait]
impl BusClient for Arc<RecordingBus> {
    async fn put_event(&self, event: &BusEvent) -> Result<(), PublishError> {
        if let Some(why) = self
            .refusing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Err(PublishError {
                bus: event.bus.clone(),
                message: why,
            });
        }
        // As EventBridge answers an entry past its limit.
        if event.entry_size() > MAX_ENTRY_BYTES {
            return Err(PublishError {
                bus: event.bus.clone(),
                message: format!(
                    "ValidationException: Total size of the entries in the request is over the \
                     limit ({} bytes)",
                    event.entry_size()
                ),
            });
        }
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event.clone());
        Ok(())
    }
}
