//! Building the AWS SDK clients.
//!
//! Endpoints come only from the standard `AWS_ENDPOINT_URL` and
//! `AWS_ENDPOINT_URL_<SERVICE>` variables, which the SDK reads itself; an
//! emulator is reached exactly as a real endpoint would be.

use aws_config::{BehaviorVersion, SdkConfig};
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};

/// Loads the shared SDK configuration with a rustls (ring) HTTPS client.
pub async fn load_sdk_config() -> SdkConfig {
    let http_client = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .build_https();
    aws_config::defaults(BehaviorVersion::latest())
        .http_client(http_client)
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

pub fn dynamodb_client(config: &SdkConfig) -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::new(config)
}
