//! The OTLP exporter's HTTP client: tiergate's own hyper client (plain HTTP/1.1, pooled), so the
//! exporter needs no second HTTP stack. Runs on the tokio runtime the export task runs on.

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use opentelemetry_http::{HttpClient, HttpError};
use std::time::Duration;

/// Largest collector answer read, bytes (an OTLP response is a few bytes; a partial-success
/// message a few hundred).
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

#[derive(Debug, Clone)]
pub(super) struct HyperClient {
    client: Client<HttpConnector, Full<Bytes>>,
    /// The whole exchange, body included.
    timeout: Duration,
}

impl HyperClient {
    pub(super) fn new(timeout: Duration) -> HyperClient {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        connector.set_nodelay(true);
        HyperClient { client: Client::builder(TokioExecutor::new()).build(connector), timeout }
    }
}

#[async_trait::async_trait]
impl HttpClient for HyperClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let exchange = async {
            let response = self.client.request(request.map(Full::new)).await?;
            let (parts, body) = response.into_parts();
            let bytes = Limited::new(body, MAX_RESPONSE_BYTES).collect().await?.to_bytes();
            Ok::<_, HttpError>(Response::from_parts(parts, bytes))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| HttpError::from(format!("no answer within {} ms", self.timeout.as_millis())))?
    }
}
