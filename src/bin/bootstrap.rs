//! The Lambda function: SQS batches of S3 notifications in, partial batch
//! responses out.

use std::sync::Arc;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{service_fn, Error, LambdaEvent};
use mediaonce::handler::{handle_batch, App, Invocation};
use mediaonce::steps::StepRegistry;

#[tokio::main]
async fn main() -> Result<(), Error> {
    // Honours AWS_LAMBDA_LOG_FORMAT=JSON and AWS_LAMBDA_LOG_LEVEL.
    lambda_runtime::tracing::init_default_subscriber();
    let app = Arc::new(App::from_env(StepRegistry::builtin()).await?);
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
