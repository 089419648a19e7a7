//! Queues and the handler as Lambda's event source mapping drives it.

use std::sync::Arc;

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use mediaonce::handler::{handle_batch, App, BatchReport, Invocation};

use super::unique;

/// The ARN of a queue.
pub async fn queue_arn(sqs: &aws_sdk_sqs::Client, queue_url: &str) -> String {
    sqs.get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .expect("queue attributes")
        .attributes
        .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
        .expect("queue arn")
}

/// One long-poll of a queue (1 s): up to 10 messages, with their system
/// attributes (`MessageGroupId` for FIFO queues among them).
pub async fn receive_from(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
) -> Vec<aws_sdk_sqs::types::Message> {
    sqs.receive_message()
        .queue_url(queue_url)
        .max_number_of_messages(10)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .wait_time_seconds(1)
        .send()
        .await
        .expect("receive")
        .messages
        .unwrap_or_default()
}

/// The ids of the messages a batch response sends back.
pub fn failed_ids(report: &BatchReport) -> Vec<String> {
    report
        .response()
        .batch_item_failures
        .into_iter()
        .map(|f| f.item_identifier)
        .collect()
}

/// An SQS message as the Lambda event source mapping delivers it, with its
/// system attributes (`MessageGroupId` for FIFO queues among them).
pub fn lambda_message(message: aws_sdk_sqs::types::Message, queue_arn: &str) -> SqsMessage {
    let mut lambda = SqsMessage::default();
    lambda.attributes = message
        .attributes
        .unwrap_or_default()
        .into_iter()
        .map(|(name, value)| (name.as_str().to_string(), value))
        .collect();
    lambda.message_id = message.message_id;
    lambda.receipt_handle = message.receipt_handle;
    lambda.body = message.body;
    lambda.md5_of_body = message.md5_of_body;
    lambda.event_source = Some("aws:sqs".into());
    lambda.event_source_arn = Some(queue_arn.to_string());
    lambda.aws_region = Some("us-east-1".into());
    lambda
}

/// Hands messages to the handler as Lambda would, with a deadline a minute
/// away on the worker's clock.
pub async fn handle_with(app: Arc<App>, messages: Vec<SqsMessage>) -> BatchReport {
    let deadline = app.now_ms() + 60_000;
    handle_before(app, messages, deadline).await
}

/// Hands messages to the handler with the invocation deadline `deadline_ms`
/// (standing for an invocation partly spent: the function's timeout is
/// not known).
pub async fn handle_before(
    app: Arc<App>,
    messages: Vec<SqsMessage>,
    deadline_ms: u64,
) -> BatchReport {
    handle_in(app, messages, deadline_ms, None).await
}

/// Hands messages to the handler in an invocation of a function whose
/// timeout is `timeout_ms` (as the runtime measures it), ending at
/// `deadline_ms`.
pub async fn handle_in(
    app: Arc<App>,
    messages: Vec<SqsMessage>,
    deadline_ms: u64,
    timeout_ms: Option<u64>,
) -> BatchReport {
    let mut event = SqsEvent::default();
    event.records = messages;
    let invocation = Invocation {
        request_id: unique("req"),
        deadline_ms: Some(deadline_ms),
        timeout_ms,
    };
    handle_batch(app, event, invocation).await
}
