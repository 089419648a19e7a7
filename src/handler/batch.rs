//! The batch: messages in lanes (one per FIFO message group, one per
//! message otherwise), at most `concurrency` at a time, cut off before the
//! invocation deadline; reports in the order the messages came.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::busy::delay_busy_message;
use super::job::BatchJobs;
use super::record::process_body;
use super::{lock, App, BatchReport, BatchUsage, Invocation, MessageReport};
use crate::fifo::lanes;
use crate::queue::queue_url_from_arn;

/// Time kept back from the invocation deadline to send the response.
const RESPONSE_RESERVE_MS: u64 = 1_000;

/// Handles one SQS batch. Messages run concurrently, except that those of
/// one FIFO message group run in order ([`crate::fifo`]). Inside Lambda it
/// returns before the invocation deadline: a message still unfinished then
/// is a batch item failure (its task is stopped; its claim expires with its
/// lease).
pub async fn handle_batch(app: Arc<App>, event: SqsEvent, invocation: Invocation) -> BatchReport {
    // Every log line of the batch names its invocation, the message tasks'
    // included (a spawned task does not inherit the caller's span).
    let span = tracing::info_span!("batch", request_id = %invocation.request_id);
    async move {
        app.invoked(&invocation);
        let before = app.usage_so_far();
        let mut report = run_batch(app.clone(), event, invocation).await;
        report.usage = app.usage_so_far().since(&before);
        app.write_metrics(&report);
        report
    }
    .instrument(span)
    .await
}

async fn run_batch(app: Arc<App>, event: SqsEvent, invocation: Invocation) -> BatchReport {
    let batch = Arc::new(BatchJobs::default());
    let invocation = Arc::new(invocation);
    let permits = Arc::new(Semaphore::new(app.config.concurrency));
    let messages = event.records;
    // A message without an id cannot be named in the response; an empty
    // identifier makes Lambda retry the whole batch, which loses nothing.
    let ids: Vec<String> = messages
        .iter()
        .map(|m| m.message_id.clone().unwrap_or_default())
        .collect();
    let lanes = lanes(&messages);
    let slots: Arc<Mutex<Vec<Option<MessageReport>>>> =
        Arc::new(Mutex::new(vec![None; messages.len()]));
    let mut messages: Vec<Option<SqsMessage>> = messages.into_iter().map(Some).collect();
    let tasks: Vec<JoinHandle<()>> = lanes
        .iter()
        .map(|lane| {
            let lane: Vec<(usize, SqsMessage)> = lane
                .iter()
                .filter_map(|&i| Some((i, messages[i].take()?)))
                .collect();
            let (app, batch, invocation, permits, slots) = (
                app.clone(),
                batch.clone(),
                invocation.clone(),
                permits.clone(),
                slots.clone(),
            );
            // Part of the same actor when the explorer runs the batch.
            tokio::spawn(crate::faults::for_same_actor(async move {
                let mut earlier_failed = false;
                for (index, message) in lane {
                    let report = if earlier_failed {
                        let message_id = message.message_id.unwrap_or_default();
                        tracing::warn!(
                            message_id,
                            "an earlier message of its FIFO group failed: not run, it comes back"
                        );
                        failed_message(
                            message_id,
                            "an earlier message of its FIFO group failed in this batch",
                        )
                    } else {
                        // Fair: messages start in the order they came.
                        let _permit = permits.acquire().await;
                        process_message(&app, &batch, &invocation, message).await
                    };
                    earlier_failed |= report.must_retry();
                    lock(&slots)[index] = Some(report);
                }
            }
            .instrument(tracing::Span::current())))
        })
        .collect();

    let cutoff = invocation.deadline_ms.map(|deadline| {
        let left = deadline
            .saturating_sub(RESPONSE_RESERVE_MS)
            .saturating_sub(app.now_ms());
        tokio::time::Instant::now() + Duration::from_millis(left)
    });
    let mut fates: Vec<Option<String>> = Vec::with_capacity(tasks.len());
    for mut task in tasks {
        let finished = match cutoff {
            Some(cutoff) => tokio::time::timeout_at(cutoff, &mut task).await.ok(),
            None => Some((&mut task).await),
        };
        fates.push(match finished {
            Some(Ok(())) => None,
            Some(Err(err)) => Some(format!("message task failed: {err}")),
            None => {
                task.abort();
                Some("unfinished at the invocation deadline".to_string())
            }
        });
    }
    let mut slots = lock(&slots);
    let mut reports = Vec::with_capacity(ids.len());
    for (lane, fate) in lanes.iter().zip(&fates) {
        for &index in lane {
            let report = slots[index].take().unwrap_or_else(|| {
                let error = fate
                    .clone()
                    .unwrap_or_else(|| "message task ended without a report".into());
                tracing::warn!(message_id = ids[index], error, "message comes back");
                failed_message(ids[index].clone(), &error)
            });
            reports.push((index, report));
        }
    }
    reports.sort_by_key(|(index, _)| *index);
    BatchReport {
        messages: reports.into_iter().map(|(_, report)| report).collect(),
        usage: BatchUsage::default(),
    }
}

fn failed_message(message_id: String, error: &str) -> MessageReport {
    MessageReport {
        message_id,
        jobs: Vec::new(),
        error: Some(error.to_string()),
    }
}

async fn process_message(
    app: &App,
    batch: &BatchJobs,
    invocation: &Invocation,
    message: SqsMessage,
) -> MessageReport {
    let message_id = message.message_id.clone().unwrap_or_default();
    let body = message.body.as_deref().unwrap_or_default();
    let queue_url = message.event_source_arn.as_deref().and_then(queue_url_from_arn);
    let report = process_body(app, batch, invocation, message_id, queue_url.as_deref(), body).await;
    if let Some(busy_until_ms) = report
        .must_retry()
        .then(|| report.busy_until_ms())
        .flatten()
    {
        delay_busy_message(app, &report.message_id, &message, busy_until_ms).await;
    }
    report
}
