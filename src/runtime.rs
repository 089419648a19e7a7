//! The Lambda function: the runtime's loop around [`crate::handle_batch`].

use std::sync::Arc;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{service_fn, Error, LambdaEvent};

use crate::handler::{handle_batch, App, Invocation};
use crate::steps::StepRegistry;

/// Runs the Lambda function with `steps`: reads the configuration from the
/// environment (its recipes bound to `steps`; a bad one fails the init with
/// the variable named), then answers each SQS batch with a partial batch
/// response. Logs honour `AWS_LAMBDA_LOG_FORMAT=JSON` and
/// `AWS_LAMBDA_LOG_LEVEL`.
pub async fn run(steps: StepRegistry) -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let app = Arc::new(App::from_env(steps).await?);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| {
        let app = app.clone();
        async move {
            let invocation = Invocation {
                request_id: event.context.request_id.clone(),
                deadline_ms: Some(event.context.deadline),
            };
            let report = handle_batch(app, event.payload, invocation).await;
            Ok::<SqsBatchResponse, Error>(report.response())
        }
    }))
    .await
}
