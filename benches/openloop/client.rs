//! The HTTP side of the generator: keep-alive connections to the target, and the request
//! bodies it sends in turn.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::Args;

pub(crate) struct Target {
    addr: String,
    authority: String,
    path: String,
}

/// Keep-alive HTTP/1.1 connections, reused last-in-first-out so that a low rate keeps few warm.
pub(crate) struct Pool {
    pub(crate) target: Target,
    pub(crate) idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
    pub(crate) opened: AtomicUsize,
}

impl Pool {
    async fn connect(&self) -> anyhow::Result<SendRequest<Full<Bytes>>> {
        let stream = tokio::net::TcpStream::connect(&self.target.addr).await?;
        stream.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        self.opened.fetch_add(1, Ordering::Relaxed);
        Ok(sender)
    }

    fn take(&self) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.idle.lock().unwrap();
        while let Some(s) = idle.pop() {
            if !s.is_closed() {
                return Some(s);
            }
        }
        None
    }

    fn put(&self, s: SendRequest<Full<Bytes>>) {
        if !s.is_closed() {
            self.idle.lock().unwrap().push(s);
        }
    }

    fn request(&self, body: Bytes) -> hyper::Request<Full<Bytes>> {
        hyper::Request::post(&self.target.path)
            .header(hyper::header::HOST, &self.target.authority)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .expect("valid request")
    }

    /// Sends one request; a reused connection that the server closed while idle is retried
    /// once on a new one (as HTTP clients do). Returns the status and the body, and the
    /// instant the request was handed to a connection.
    pub(crate) async fn send(&self, body: Bytes) -> anyhow::Result<(hyper::StatusCode, Bytes)> {
        for _ in 0..2 {
            let (mut s, reused) = match self.take() {
                Some(s) => (s, true),
                None => (self.connect().await?, false),
            };
            if let Err(e) = s.ready().await {
                if reused {
                    continue;
                }
                return Err(e.into());
            }
            match s.send_request(self.request(body.clone())).await {
                Ok(resp) => {
                    let status = resp.status();
                    let keep = !resp
                        .headers()
                        .get(hyper::header::CONNECTION)
                        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
                    let bytes = resp.into_body().collect().await?.to_bytes();
                    if keep {
                        self.put(s);
                    }
                    return Ok((status, bytes));
                }
                Err(e) if reused && (e.is_canceled() || e.is_closed() || e.is_incomplete_message()) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        anyhow::bail!("connection closed twice")
    }
}

pub(crate) fn parse_url(url: &str) -> anyhow::Result<Target> {
    let uri: hyper::Uri = url.parse()?;
    anyhow::ensure!(uri.scheme_str() == Some("http"), "only http:// URLs");
    let authority = uri.authority().ok_or_else(|| anyhow::anyhow!("URL without host"))?.to_string();
    let addr = if uri.port().is_some() { authority.clone() } else { format!("{authority}:80") };
    let path = uri.path_and_query().map(|p| p.to_string()).unwrap_or_else(|| "/".into());
    Ok(Target { addr, authority, path })
}

pub(crate) fn load_bodies(args: &Args) -> anyhow::Result<Vec<Bytes>> {
    let mut bodies = Vec::new();
    for file in &args.data {
        let content = std::fs::read_to_string(file).map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))?;
        for line in content.lines().filter(|l| !l.trim().is_empty()) {
            let v: serde_json::Value = serde_json::from_str(line)?;
            if let Some(text) = v["text"].as_str() {
                if text.len() >= args.min_bytes && text.len() <= args.max_bytes {
                    bodies.push(Bytes::from(serde_json::to_vec(&serde_json::json!({ "text": text }))?));
                }
            }
        }
    }
    anyhow::ensure!(!bodies.is_empty(), "no messages in --data within the byte limits");
    Ok(bodies)
}
