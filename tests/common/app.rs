//! A real upstream app for proxy tests: a small hyper server that records what it receives.
//!
//! Routes (any method):
//! * `/echo...` — answers 200 with the request body streamed back unchanged;
//! * `/bytes?n=N` — streams N bytes (a repeating pattern, see [`pattern`]) in 16 KiB chunks;
//! * `/slow?ms=N` — waits N ms before the response head;
//! * `/stall` — sends the head and one chunk, then nothing;
//! * `/status?code=N` — answers with that status;
//! * `/sse?events=a|b|c&gap_ms=N` — Server-Sent Events, one OpenAI-style delta per event,
//!   `gap_ms` apart, then `data: [DONE]`;
//! * `/text?chunks=a|b|c&gap_ms=N` — the same pieces as chunked `text/plain`.
//! * any path with an `x-reply: a|b|c` header — an OpenAI-compatible chat completion stream
//!   (`chat.completion.chunk`s with one id and model, 20 ms apart, a last chunk with
//!   `finish_reason: "stop"`, then `data: [DONE]`), as a model server would send it.
//! Everything else: 200 `{"app": true}`.
//! Every request's method, URI, version and headers are recorded ([`AppHandle::requests`]),
//! with the body for `/echo`.

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// One request as the app saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub uri: String,
    pub version: http::Version,
    pub headers: HeaderMap,
    pub body: Bytes,
}

#[derive(Clone, Default)]
pub struct AppHandle {
    addr: Option<SocketAddr>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl AppHandle {
    pub fn addr(&self) -> SocketAddr {
        self.addr.expect("started")
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// Requests received so far (those on `/echo` once their body was read, with it).
    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn last(&self) -> Seen {
        self.requests().last().cloned().expect("the app received a request")
    }
}

/// The byte at offset `i` of `/bytes` bodies (and of test uploads): not periodic in small powers
/// of two, so a dropped or repeated chunk shows.
pub fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| ((i * 31 + i / 997) % 251) as u8).collect()
}

/// Starts the app on an ephemeral port, HTTP/1.1 and HTTP/2 (h2c prior knowledge) both, on its
/// own thread and runtime so it outlives any one test's runtime.
pub fn start() -> AppHandle {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let handle = AppHandle { addr: Some(listener.local_addr().unwrap()), seen: Arc::default() };
            tx.send(handle.clone()).unwrap();
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let handle = handle.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let handle = handle.clone();
                        async move { Ok::<_, Infallible>(serve(handle, req).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
    });
    rx.recv().expect("app started")
}

fn query(req: &Request<Incoming>, key: &str) -> Option<String> {
    form_urlencoded::parse(req.uri().query()?.as_bytes()).find(|(k, _)| k == key).map(|(_, v)| v.into_owned())
}

fn full(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()).boxed());
    *r.status_mut() = status;
    r
}

fn streamed(content_type: &str, pieces: Vec<Bytes>, gap: Duration) -> Response<Body> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
    tokio::spawn(async move {
        for piece in pieces {
            if tx.send(Ok(Frame::data(piece))).await.is_err() {
                return;
            }
            tokio::time::sleep(gap).await;
        }
    });
    let body = StreamBody::new(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)));
    let mut r = Response::new(body.boxed());
    r.headers_mut().insert(http::header::CONTENT_TYPE, content_type.parse().unwrap());
    r
}

/// `/echo...`: the request recorded with its body, which comes back with hop-by-hop headers the
/// proxy must strip.
async fn echo(handle: AppHandle, req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    handle.seen.lock().unwrap().push(Seen {
        method: parts.method.to_string(),
        uri: parts.uri.to_string(),
        version: parts.version,
        headers: parts.headers.clone(),
        body: body.clone(),
    });
    let mut r = full(StatusCode::OK, body);
    r.headers_mut().insert("x-app", "echo".parse().unwrap());
    r.headers_mut().insert("connection", "x-app-hop".parse().unwrap());
    r.headers_mut().insert("x-app-hop", "must not reach the client".parse().unwrap());
    r
}

/// An OpenAI-style chat completion streamed as server-sent events, one chunk per `|`-separated
/// piece of `reply`.
fn chat_completion_stream(reply: &str) -> Response<Body> {
    let chunk = |delta: serde_json::Value, finish: Option<&str>| {
        let chunk = serde_json::json!({"id": "chatcmpl-app", "object": "chat.completion.chunk", "created": 1764547200,
            "model": "app-model", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        Bytes::from(format!("data: {chunk}\n\n"))
    };
    let mut pieces: Vec<Bytes> =
        reply.split('|').map(|piece| chunk(serde_json::json!({"content": piece}), None)).collect();
    pieces.push(chunk(serde_json::json!({}), Some("stop")));
    pieces.push(Bytes::from_static(b"data: [DONE]\n\n"));
    streamed("text/event-stream", pieces, Duration::from_millis(20))
}

async fn serve(handle: AppHandle, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let gap = Duration::from_millis(query(&req, "gap_ms").and_then(|v| v.parse().ok()).unwrap_or(0));
    if !path.starts_with("/echo") {
        // Recorded at once, body unread (`/echo` records after reading it).
        handle.seen.lock().unwrap().push(Seen {
            method: req.method().to_string(),
            uri: req.uri().to_string(),
            version: req.version(),
            headers: req.headers().clone(),
            body: Bytes::new(),
        });
    }
    match path.as_str() {
        p if p.starts_with("/echo") => echo(handle, req).await,
        "/bytes" => {
            let n: usize = query(&req, "n").and_then(|v| v.parse().ok()).unwrap_or(0);
            let pieces = pattern(n).chunks(16 * 1024).map(Bytes::copy_from_slice).collect();
            streamed("application/octet-stream", pieces, gap)
        }
        "/slow" => {
            let ms: u64 = query(&req, "ms").and_then(|v| v.parse().ok()).unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            full(StatusCode::OK, "slow")
        }
        "/stall" => {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(1);
            tokio::spawn(async move {
                let _ = tx.send(Ok(Frame::data(Bytes::from_static(b"first")))).await;
                tokio::time::sleep(Duration::from_secs(3600)).await;
                drop(tx);
            });
            Response::new(StreamBody::new(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))).boxed())
        }
        "/status" => {
            let code: u16 = query(&req, "code").and_then(|v| v.parse().ok()).unwrap_or(200);
            full(StatusCode::from_u16(code).unwrap(), format!("status {code}"))
        }
        "/sse" => {
            let events = query(&req, "events").unwrap_or_default();
            let mut pieces: Vec<Bytes> = events
                .split('|')
                .map(|piece| {
                    let chunk = serde_json::json!({"choices": [{"index": 0, "delta": {"content": piece}}]});
                    Bytes::from(format!("data: {chunk}\n\n"))
                })
                .collect();
            pieces.push(Bytes::from_static(b"data: [DONE]\n\n"));
            streamed("text/event-stream", pieces, gap)
        }
        "/text" => {
            let chunks = query(&req, "chunks").unwrap_or_default();
            streamed("text/plain; charset=utf-8", chunks.split('|').map(|c| Bytes::from(c.to_string())).collect(), gap)
        }
        _ if req.headers().contains_key("x-reply") => {
            chat_completion_stream(req.headers()["x-reply"].to_str().unwrap_or_default())
        }
        _ => full(StatusCode::OK, r#"{"app": true}"#),
    }
}
