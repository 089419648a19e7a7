//! Building the AWS SDK clients.
//!
//! Endpoints come only from the standard `AWS_ENDPOINT_URL` and
//! `AWS_ENDPOINT_URL_<SERVICE>` variables, which the SDK reads itself; an
//! emulator is reached exactly as a real endpoint would be.

mod http_client;

pub use http_client::Http1Client;

use aws_config::{BehaviorVersion, SdkConfig};

/// Loads the shared SDK configuration with an HTTP/1.1 rustls (ring)
/// client (`http_client.rs` says why not the SDK's own).
pub async fn load_sdk_config() -> SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .http_client(Http1Client::new().shared())
        .load()
        .await
}

/// An S3 client. With an overridden endpoint (an emulator, a VPC endpoint
/// by URL, an S3-compatible store) virtual-host addressing would need DNS
/// for every bucket name, so path-style addressing is used.
pub fn s3_client(config: &SdkConfig) -> aws_sdk_s3::Client {
    let endpoint_overridden = ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"]
        .iter()
        .any(|var| std::env::var_os(var).is_some_and(|v| !v.is_empty()));
    let s3_config = aws_sdk_s3::config::Builder::from(config)
        .force_path_style(endpoint_overridden)
        .build();
    aws_sdk_s3::Client::from_conf(s3_config)
}

pub fn sqs_client(config: &SdkConfig) -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::new(config)
}

pub fn dynamodb_client(config: &SdkConfig) -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::new(config)
}

/// A short description of an SDK error: the HTTP status and the service's
/// error code and message when the service answered, else the whole chain
/// (timeouts, connection failures).
pub fn describe_error<E, R>(err: &aws_smithy_runtime_api::client::result::SdkError<E, R>) -> String
where
    E: aws_smithy_types::error::metadata::ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + HasStatus,
{
    use aws_smithy_runtime_api::client::result::SdkError;
    match err {
        SdkError::ServiceError(service) => {
            let status = service.raw().status_code();
            let inner = service.err();
            match (inner.code(), inner.message()) {
                (Some(code), Some(message)) => format!("HTTP {status} {code}: {message}"),
                (Some(code), None) => format!("HTTP {status} {code}"),
                _ => format!("HTTP {status}"),
            }
        }
        other => aws_smithy_types::error::display::DisplayErrorContext(other).to_string(),
    }
}

/// The status code of a raw response.
pub trait HasStatus {
    fn status_code(&self) -> u16;
}

impl HasStatus for aws_smithy_runtime_api::http::Response {
    fn status_code(&self) -> u16 {
        self.status().as_u16()
    }
}

pub fn eventbridge_client(config: &SdkConfig) -> aws_sdk_eventbridge::Client {
    aws_sdk_eventbridge::Client::new(config)
}
