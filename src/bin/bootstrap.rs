//! The Lambda function with the built-in steps: SQS batches of S3
//! notifications in, partial batch responses out.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    mediaonce::run(mediaonce::StepRegistry::builtin()).await
}
