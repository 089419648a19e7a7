//! The HTTP client under every AWS SDK client: HTTP/1.1 over rustls (ring),
//! with the system's root certificates.
//!
//! Why not `aws-smithy-http-client`, the SDK's own: it always links HTTP/2
//! (h2 and hyper's HTTP/2 code, ~0.3 MB of the arm64 `bootstrap`), and none
//! of the endpoints mediaonce calls speaks it: S3, DynamoDB, SQS and STS
//! answer HTTP/1.1. This is the same stack (hyper-util's pooled client,
//! hyper-rustls) with only HTTP/1.1 built, and it keeps what the SDK relies
//! on from its client:
//! - the connect and read timeouts of `HttpConnectorSettings` (one pool per
//!   distinct pair, as the SDK's client does);
//! - errors classified the way the SDK's retry strategy expects: a refused
//!   or reset connection and a response cut short are I/O errors (retried),
//!   an elapsed timeout is a timeout;
//! - connection poisoning: after a transient error the SDK marks the
//!   request's connection so that the retry opens a new one.
//!
//! No proxy support (`HTTPS_PROXY`): the SDK's client does not read those
//! variables by default either.

use std::collections::HashMap;
use std::error::Error;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_smithy_runtime_api::client::connection::{CaptureSmithyConnection, ConnectionMetadata};
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::HttpRequest;
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::retry::ErrorKind;
use hyper_util::client::legacy::connect::{capture_connection, HttpConnector as TcpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

type BoxError = Box<dyn Error + Send + Sync>;
type HttpsConnector = hyper_rustls::HttpsConnector<TcpConnector>;

/// An `HttpClient` for the SDK: build one and pass it to the config loader.
#[derive(Debug, Clone)]
pub struct Http1Client {
    tls: Arc<rustls::ClientConfig>,
    /// One connector (and so one connection pool) per (connect, read)
    /// timeout pair; every SDK client here uses the same pair.
    connectors: Arc<Mutex<HashMap<TimeoutKey, SharedHttpConnector>>>,
}

type TimeoutKey = (Option<Duration>, Option<Duration>);

impl Http1Client {
    /// Loads the system's root certificates (once: the SDK asks for a
    /// connector per client, and reading the store costs milliseconds).
    /// A system without any gets a warning, as with the SDK's own client:
    /// plain-HTTP endpoints (emulators) still work, HTTPS ones fail on the
    /// certificate.
    pub fn new() -> Self {
        let loaded = rustls_native_certs::load_native_certs();
        let mut roots = rustls::RootCertStore::empty();
        let (valid, _invalid) = roots.add_parsable_certificates(loaded.certs);
        if valid == 0 {
            tracing::warn!(
                errors = loaded.errors.len(),
                "no root CA certificates found on this system: HTTPS requests will fail"
            );
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports TLS 1.2 and 1.3")
            .with_root_certificates(roots)
            .with_no_client_auth();
        Self {
            tls: Arc::new(tls),
            connectors: Arc::default(),
        }
    }

    /// This client as the SDK's shared type.
    pub fn shared(self) -> SharedHttpClient {
        SharedHttpClient::new(self)
    }

    fn connector(&self, settings: &HttpConnectorSettings) -> Connector {
        let mut tcp = TcpConnector::new();
        tcp.enforce_http(false);
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(settings.connect_timeout());
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config((*self.tls).clone())
            // Emulators and some private endpoints are plain HTTP.
            .https_or_http()
            .enable_http1()
            .wrap_connector(tcp);
        let client = Client::builder(TokioExecutor::new())
            // Idle connections are closed on hyper's timer (90 s by default).
            .pool_timer(TokioTimer::new())
            .build(https);
        Connector {
            client,
            read_timeout: settings.read_timeout(),
        }
    }
}

impl Default for Http1Client {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpClient for Http1Client {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        _components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        self.pooled_connector(settings)
    }
}

impl Http1Client {
    fn pooled_connector(&self, settings: &HttpConnectorSettings) -> SharedHttpConnector {
        let key = (settings.connect_timeout(), settings.read_timeout());
        let mut connectors = self.connectors.lock().unwrap_or_else(|p| p.into_inner());
        connectors
            .entry(key)
            .or_insert_with(|| SharedHttpConnector::new(self.connector(settings)))
            .clone()
    }
}

#[derive(Debug, Clone)]
struct Connector {
    client: Client<HttpsConnector, SdkBody>,
    /// From sending the request to the response's head, as the SDK's own
    /// client measures it.
    read_timeout: Option<Duration>,
}

impl HttpConnector for Connector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let mut request = match request.try_into_http1x() {
            Ok(request) => request,
            Err(err) => return HttpConnectorFuture::ready(Err(ConnectorError::user(err.into()))),
        };
        let captured = capture_connection(&mut request);
        if let Some(capture) = request.extensions().get::<CaptureSmithyConnection>() {
            capture.set_connection_retriever(move || {
                if captured.connection_metadata().is_none() {
                    return None;
                }
                let captured = captured.clone();
                Some(
                    ConnectionMetadata::builder()
                        .proxied(false)
                        .poison_fn(move || {
                            if let Some(connected) = captured.connection_metadata().as_ref() {
                                connected.poison();
                            }
                        })
                        .build(),
                )
            });
        }
        let response = self.client.request(request);
        let read_timeout = self.read_timeout;
        HttpConnectorFuture::new(async move {
            let result = match read_timeout {
                Some(limit) => match tokio::time::timeout(limit, response).await {
                    Ok(result) => result,
                    Err(_) => {
                        return Err(ConnectorError::timeout(
                            format!("no HTTP response within the read timeout ({limit:?})").into(),
                        ))
                    }
                },
                None => response.await,
            };
            match result {
                Ok(response) => HttpResponse::try_from(response.map(SdkBody::from_body_1_x))
                    .map_err(|err| ConnectorError::other(err.into(), None)),
                Err(err) => Err(classify(err)),
            }
        })
    }
}

/// What kind of failure the SDK's retry strategy should see, by the rules
/// its own client applies to the same hyper errors.
fn classify(err: hyper_util::client::legacy::Error) -> ConnectorError {
    let kind = if err.is_connect() {
        Kind::Io
    } else if let Some(hyper) = find_source::<hyper::Error>(&err) {
        if hyper.is_timeout() {
            Kind::Timeout
        } else if hyper.is_user() {
            Kind::User
        } else if hyper.is_closed()
            || hyper.is_canceled()
            || find_source::<std::io::Error>(hyper).is_some()
        {
            Kind::Io
        } else if hyper.is_incomplete_message() {
            // The connection closed mid-response (seen from S3).
            Kind::Transient
        } else {
            Kind::Other
        }
    } else if find_source::<std::io::Error>(&err).is_some() {
        Kind::Io
    } else {
        Kind::Other
    };
    let err: BoxError = Box::new(err);
    match kind {
        Kind::Io => ConnectorError::io(err),
        Kind::Timeout => ConnectorError::timeout(err),
        Kind::User => ConnectorError::user(err),
        Kind::Transient => ConnectorError::other(err, Some(ErrorKind::TransientError)),
        Kind::Other => ConnectorError::other(err, None),
    }
}

enum Kind {
    Io,
    Timeout,
    User,
    Transient,
    Other,
}

fn find_source<'a, E: Error + 'static>(err: &'a (dyn Error + 'static)) -> Option<&'a E> {
    let mut next = Some(err);
    while let Some(err) = next {
        if let Some(found) = err.downcast_ref::<E>() {
            return Some(found);
        }
        next = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_connection_is_an_io_error_the_sdk_retries() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // A port nothing listens on: bind, read the port, close.
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let client = Http1Client::new();
        let connector = client.connector(&HttpConnectorSettings::builder().build());
        let request = HttpRequest::try_from(
            http::Request::get(format!("http://127.0.0.1:{port}/"))
                .body(SdkBody::empty())
                .unwrap(),
        )
        .unwrap();
        let err = rt.block_on(connector.call(request)).unwrap_err();
        assert!(err.is_io(), "{err:?}");
    }

    #[test]
    fn a_silent_server_is_a_read_timeout() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            // Accepts the connection and never answers.
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let server = tokio::spawn(async move {
                let (socket, _) = listener.accept().await.unwrap();
                std::future::pending::<()>().await;
                drop(socket);
            });
            let client = Http1Client::new();
            let settings = HttpConnectorSettings::builder()
                .read_timeout(Duration::from_millis(50))
                .build();
            let connector = client.connector(&settings);
            let request = HttpRequest::try_from(
                http::Request::get(format!("http://127.0.0.1:{port}/"))
                    .body(SdkBody::empty())
                    .unwrap(),
            )
            .unwrap();
            let err = connector.call(request).await.unwrap_err();
            assert!(err.is_timeout(), "{err:?}");
            server.abort();
        });
    }

    #[test]
    fn one_connector_per_timeout_pair() {
        let client = Http1Client::new();
        let a = HttpConnectorSettings::builder()
            .connect_timeout(Duration::from_secs(3))
            .build();
        let b = HttpConnectorSettings::builder()
            .connect_timeout(Duration::from_secs(5))
            .build();
        client.pooled_connector(&a);
        client.pooled_connector(&a);
        client.pooled_connector(&b);
        assert_eq!(client.connectors.lock().unwrap().len(), 2);
    }
}
