//! The Lambda function: the runtime's loop around [`crate::handle_batch`],
//! and the scheduled sweep that collects what nothing references.

use std::sync::Arc;

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::Value;

use crate::handler::{handle_batch, App, Invocation, MetricsOut, LAMBDA_MAX_TIMEOUT};
use crate::steps::StepRegistry;

/// Runs the Lambda function with `steps`: reads the configuration from the
/// environment (its recipes bound to `steps`; a bad one fails the init with
/// the variable named), then answers each SQS batch with a partial batch
/// response. An EventBridge scheduled event (`detail-type: Scheduled
/// Event`) runs the collection sweep instead. Logs honour
/// `AWS_LAMBDA_LOG_FORMAT=JSON` and `AWS_LAMBDA_LOG_LEVEL`.
pub async fn run(steps: StepRegistry) -> Result<(), Error> {
    crate::logging::init(std::io::stdout);
    let app = Arc::new(App::from_env(steps).await?.with_metrics_out(MetricsOut::Stdout));
    // A recipe no invocation can start fails the init, with its name, not
    // every job of it at run time (those past this function's own timeout
    // are refused per job: Lambda tells it only through each deadline).
    if let Some(problem) = app.recipe_beyond(LAMBDA_MAX_TIMEOUT) {
        return Err(format!("configuration error: {problem}").into());
    }
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| {
        let app = app.clone();
        async move {
            if is_scheduled(&event.payload) {
                // A job whose collection fails is logged, backed off and
                // counted; the sweep still succeeds (a failed invocation
                // would retry every collection), and the alarm on
                // `CollectionFailures` says so.
                let sweep = app.collect_due(false).await.map_err(Error::from)?;
                app.write_sweep_metrics(&sweep);
                tracing::info!(
                    jobs = sweep.collected.len(),
                    objects = sweep.objects(),
                    failures = sweep.failures.len(),
                    "collection sweep"
                );
                return Ok::<Value, Error>(serde_json::json!({
                    "collected": sweep.collected.len(),
                    "objects": sweep.objects(),
                    "failures": sweep.failures.len(),
                }));
            }
            let batch: SqsEvent = serde_json::from_value(event.payload)?;
            let invocation = Invocation {
                request_id: event.context.request_id.clone(),
                deadline_ms: Some(event.context.deadline),
                timeout_ms: Some(event.context.deadline.saturating_sub(app.now_ms())),
            };
            let report = handle_batch(app, batch, invocation).await;
            Ok(serde_json::to_value(report.response())?)
        }
    }))
    .await
}

/// Whether an invocation is EventBridge's schedule rather than SQS's batch.
fn is_scheduled(payload: &Value) -> bool {
    payload.get("source").and_then(Value::as_str) == Some("aws.events")
        && payload.get("detail-type").and_then(Value::as_str) == Some("Scheduled Event")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_is_told_from_a_batch() {
        let schedule = serde_json::json!({
            "version": "0", "id": "x", "detail-type": "Scheduled Event",
            "source": "aws.events", "account": "123456789012",
            "time": "2026-12-03T00:00:00Z", "region": "us-east-1",
            "resources": ["arn:aws:events:us-east-1:123456789012:rule/sweep"], "detail": {}
        });
        assert!(is_scheduled(&schedule));
        let batch = serde_json::json!({"Records": [{"messageId": "1", "body": "{}"}]});
        assert!(!is_scheduled(&batch));
    }
}
