//! A fleet's labels: each replica keeps its own audit store, so a label whose record is not in
//! this replica's store is offered to the others (`[feedback] peers`, their admin listeners) in
//! turn until one holds it. A forwarded request carries [`FORWARDED`] and is never forwarded
//! again, so two replicas cannot bounce a label between them; a tenant scope travels in
//! [`TENANT_SCOPE`], which a replica reads only from a request that passed its admin token.

use super::{Applied, Label, Outcome};
use bytes::Bytes;
use http::{header, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// Marks a label request one replica forwarded to another.
pub const FORWARDED: &str = "x-tiergate-forwarded";
/// The tenant a forwarded label is scoped to (a tenant's key labelled on the public listener).
pub const TENANT_SCOPE: &str = "x-tiergate-tenant-scope";

/// The other replicas and how to reach them.
pub struct Peers {
    client: Client<HttpConnector, Full<Bytes>>,
    peers: Vec<Uri>,
    /// This replica's `[admin] token`, presented to the peers (a fleet shares it).
    token: Option<String>,
    timeout: Duration,
}

/// A peer that could not answer: the labels it might hold stay unknown, so the caller answers
/// 503 rather than a 404 that would tell the client to give up.
#[derive(Debug)]
pub struct Unreachable(pub String);

impl Peers {
    pub fn new(peers: &[String], token: Option<String>, timeout: Duration) -> Peers {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Peers { client, peers: peers.iter().filter_map(|p| p.parse().ok()).collect(), token, timeout }
    }

    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// Offers the labels at `unknown` (indexes into `labels`, whose results are in `applied`)
    /// to each peer in turn; fills in what a peer found (`replica`: its address). Errors: a
    /// peer failed while some labels were still unknown.
    pub async fn forward(
        &self,
        labels: &[Label],
        applied: &mut [Applied],
        scope: Option<&str>,
    ) -> Result<(), Unreachable> {
        let mut failed = None;
        for peer in &self.peers {
            let open: Vec<usize> = (0..labels.len()).filter(|&i| applied[i].outcome == Outcome::Unknown).collect();
            if open.is_empty() {
                break;
            }
            let body = serde_json::Value::Array(open.iter().map(|&i| labels[i].to_json()).collect());
            match self.ask(peer, body, scope).await {
                Ok(results) if results.len() == open.len() => {
                    for (i, mut found) in open.into_iter().zip(results) {
                        if found.outcome != Outcome::Unknown {
                            found.replica = Some(found.replica.unwrap_or_else(|| peer.to_string()));
                            applied[i] = found;
                        }
                    }
                }
                Ok(results) => failed = Some(format!("{peer} answered {} results for {}", results.len(), open.len())),
                Err(e) => failed = Some(format!("{peer}: {e}")),
            }
        }
        match failed {
            Some(why) if applied.iter().any(|a| a.outcome == Outcome::Unknown) => Err(Unreachable(why)),
            _ => Ok(()),
        }
    }

    async fn ask(&self, peer: &Uri, body: serde_json::Value, scope: Option<&str>) -> anyhow::Result<Vec<Applied>> {
        let uri = format!("{}/v1/feedback", peer.to_string().trim_end_matches('/'));
        let mut req = Request::post(uri).header(header::CONTENT_TYPE, "application/json").header(FORWARDED, "1");
        if let Some(token) = &self.token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        if let Some(scope) = scope {
            req = req.header(TENANT_SCOPE, scope);
        }
        let req = req.body(Full::new(Bytes::from(body.to_string())))?;
        let response = tokio::time::timeout(self.timeout, async {
            let response = self.client.request(req).await?;
            let status = response.status();
            let bytes = response.into_body().collect().await?.to_bytes();
            anyhow::Ok((status, bytes))
        })
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {} ms", self.timeout.as_millis()))??;
        anyhow::ensure!(response.0.is_success(), "answered {}", response.0);
        #[derive(serde::Deserialize)]
        struct Answer {
            results: Vec<Applied>,
        }
        Ok(serde_json::from_slice::<Answer>(&response.1)?.results)
    }
}
