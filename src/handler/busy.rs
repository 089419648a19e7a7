//! Busy messages come back when their holder's lease ends, not after the
//! queue's whole visibility timeout.

use aws_lambda_events::event::sqs::SqsMessage;

use super::App;
use crate::queue::{busy_delay_secs, queue_url_from_arn};

/// Hands a busy message back for when its holder's lease ends. Failing to is
/// harmless: it comes back after the queue's visibility timeout instead.
pub(super) async fn delay_busy_message(
    app: &App,
    message_id: &str,
    message: &SqsMessage,
    busy_until_ms: u64,
) {
    let (Some(arn), Some(receipt_handle)) = (&message.event_source_arn, &message.receipt_handle)
    else {
        tracing::warn!(
            message_id,
            "busy message has no queue ARN or receipt handle: left as it is"
        );
        return;
    };
    let Some(queue_url) = queue_url_from_arn(arn) else {
        tracing::warn!(
            message_id,
            arn,
            "busy message's eventSourceARN is not an SQS queue: left as it is"
        );
        return;
    };
    // The lease ends by the holder's clock, which may be behind this
    // worker's by up to the margin (DESIGN.md, "Clock skew"): the message
    // comes back only once the lease has passed for every worker, so that
    // a worker behind does not find it busy again and spend a receive.
    let margin_ms = u64::try_from(app.config.lease.deadline_margin.as_millis()).unwrap_or(0);
    let seconds = busy_delay_secs(
        busy_until_ms.saturating_add(margin_ms),
        app.now_ms(),
        app.jitter_ms(),
    );
    match app.queue.delay(&queue_url, receipt_handle, seconds).await {
        Ok(()) => tracing::info!(
            message_id,
            seconds,
            "busy message comes back when the holder's lease ends"
        ),
        Err(err) => tracing::warn!(message_id, error = %err, "could not delay the busy message"),
    }
}
