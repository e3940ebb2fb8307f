//! Sockets that cost their client nothing must not hold the gate: raw TCP clients against the
//! real server. Before its first request a connection has `header_read_timeout_ms` (silent, half
//! an HTTP/2 preface, an HTTP/2 preface and SETTINGS with no stream); after one,
//! `idle_timeout_ms` with nothing in flight; an HTTP/2 peer that stops answering keep-alive
//! pings is disconnected. With every `max_connections` slot taken by such sockets, an honest
//! request is still answered once they are closed.

mod common;

use serde_json::json;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The client connection preface of HTTP/2 (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty SETTINGS frame: length 0, type 4, no flags, stream 0.
const SETTINGS: [u8; 9] = [0, 0, 0, 4, 0, 0, 0, 0, 0];

fn server(tune: impl FnOnce(&mut tiergate::Config)) -> SocketAddr {
    let mut config = common::config(&common::repo().join("policies"));
    tune(&mut config);
    common::start(config)
}

/// Reads until the server closes the connection (EOF or reset); how long that took from
/// `since`, or `None` if it is still open at `limit`.
async fn closed_after(stream: &mut TcpStream, since: Instant, limit: Duration) -> Option<Duration> {
    let mut buf = [0u8; 4096];
    loop {
        let left = limit.checked_sub(since.elapsed())?;
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => return Some(since.elapsed()),
            Ok(Ok(_)) => {} // a GOAWAY, SETTINGS, PING...: not closed yet
        }
    }
}

/// `max_connections = 32`, taken by 32 silent sockets and then 32 that sent half of the HTTP/2
/// preface (waiting in the accept backlog meanwhile): each is closed `header_read_timeout_ms`
/// after it was accepted, so the second 32 go within two of them, and an honest `/v1/classify`
/// sent after all 64 is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_half_preface_sockets_cannot_hold_the_gate() {
    const TIMEOUT: Duration = Duration::from_millis(1000);
    let addr = server(|c| {
        c.server.max_connections = 32;
        c.server.header_read_timeout_ms = TIMEOUT.as_millis() as u64;
    });
    // The model is loaded and warm before the sockets come: this test is about the sockets.
    assert_eq!(common::classify_unhurried(addr, json!({"text": "warm up"})).await.status, 200);
    // Its client is gone; give the server a moment to see that connection closed and free its slot.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let started = Instant::now();
    let mut idle = Vec::new();
    for i in 0..64 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        if i >= 32 {
            stream.write_all(&PREFACE[..PREFACE.len() / 2]).await.unwrap();
        }
        idle.push(stream);
    }
    let honest = tokio::spawn(async move {
        let body = json!({"text": "Are we still on for lunch tomorrow?"});
        tokio::time::timeout(3 * TIMEOUT + Duration::from_secs(10), common::classify_unhurried(addr, body)).await
    });
    let watchers: Vec<_> = idle
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move { closed_after(&mut s, started, 3 * TIMEOUT + Duration::from_secs(3)).await })
        })
        .collect();
    let mut closed = Vec::new();
    for (i, w) in watchers.into_iter().enumerate() {
        let after = w.await.unwrap().unwrap_or_else(|| panic!("socket {i} still open after {:?}", started.elapsed()));
        closed.push(after);
    }
    closed.sort();
    // Accepted at once, the first 32 go after one timeout; the rest after two (plus scheduling).
    let slack = Duration::from_millis(900);
    assert!(closed[31] < TIMEOUT + slack, "the first 32 closed by {:?}", closed[31]);
    assert!(closed[0] >= TIMEOUT - Duration::from_millis(50), "closed before the timeout: {:?}", closed[0]);
    assert!(closed[63] < 2 * TIMEOUT + 2 * slack, "all 64 closed by {:?}", closed[63]);
    let reply = honest.await.unwrap().expect("the honest request is answered, not left waiting");
    assert_eq!(reply.status, 200, "{:?}", reply.body);
}

/// An HTTP/2 connection that sent its preface and SETTINGS but opens no stream is closed after
/// `header_read_timeout_ms` (with a GOAWAY); one that was served is closed after
/// `idle_timeout_ms` with no request in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_connections_without_requests_are_closed() {
    let addr = server(|c| {
        c.server.header_read_timeout_ms = 800;
        c.server.idle_timeout_ms = 1500;
    });
    let mut quiet = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    quiet.write_all(&[PREFACE, &SETTINGS].concat()).await.unwrap();
    let after = closed_after(&mut quiet, started, Duration::from_secs(6)).await.expect("closed");
    assert!((Duration::from_millis(750)..Duration::from_millis(3000)).contains(&after), "closed after {after:?}");

    // One GET /healthz on stream 1, then silence: idle from the end of its response.
    let mut served = TcpStream::connect(addr).await.unwrap();
    served.write_all(&[PREFACE, &SETTINGS].concat()).await.unwrap();
    served.write_all(&headers_frame(1, "/healthz")).await.unwrap();
    let answered = read_until_end_of_stream(&mut served, 1).await;
    let after = closed_after(&mut served, answered, Duration::from_secs(8)).await.expect("closed when idle");
    assert!((Duration::from_millis(1400)..Duration::from_millis(4000)).contains(&after), "closed after {after:?}");
}

/// An HTTP/1.1 keep-alive connection idle for longer than `header_read_timeout_ms` (but less
/// than `idle_timeout_ms`) still serves its next request: a balancer that pools connections for
/// up to its own idle timeout must never send into one tiergate is closing. Once idle for
/// `idle_timeout_ms` it is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_keep_alive_outlives_the_header_read_timeout() {
    let addr = server(|c| {
        c.server.header_read_timeout_ms = 400;
        c.server.idle_timeout_ms = 2500;
    });
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let get = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    stream.write_all(get).await.unwrap();
    assert!(read_http1_response(&mut stream).await.starts_with("HTTP/1.1 200"));
    // Three header-read timeouts of silence, then the next request on the same connection.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    stream.write_all(get).await.unwrap();
    let second = read_http1_response(&mut stream).await;
    assert!(second.starts_with("HTTP/1.1 200"), "the idle connection was closed: {second:?}");
    let answered = Instant::now();
    let after = closed_after(&mut stream, answered, Duration::from_secs(8)).await.expect("closed when idle");
    assert!((Duration::from_millis(2400)..Duration::from_millis(5000)).contains(&after), "closed after {after:?}");
}

/// Reads one HTTP/1.1 response with a `content-length` body; empty if the connection closed
/// first.
async fn read_http1_response(stream: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string()))
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(0);
            if got.len() >= end + 4 + length {
                return text;
            }
        }
        match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => return String::from_utf8_lossy(&got).to_string(),
        }
    }
}

/// An HTTP/2 client that stops answering keep-alive pings is disconnected after
/// `http2_keep_alive_interval_ms` + `http2_keep_alive_timeout_ms`, long before the idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_keep_alive_pings_disconnect_a_peer_that_stopped_answering() {
    let addr = server(|c| {
        c.server.header_read_timeout_ms = 30_000;
        c.server.idle_timeout_ms = 30_000;
        c.server.http2_keep_alive_interval_ms = 300;
        c.server.http2_keep_alive_timeout_ms = 300;
    });
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    stream.write_all(&[PREFACE, &SETTINGS].concat()).await.unwrap();
    let mut pinged = None;
    while pinged.is_none() {
        let (kind, flags, _, _) = tokio::time::timeout(Duration::from_secs(3), read_frame(&mut stream))
            .await
            .expect("a PING within 3 s")
            .expect("the connection is open until the ping goes unanswered");
        if kind == 6 && flags & 1 == 0 {
            pinged = Some(started.elapsed());
        }
    }
    let after = closed_after(&mut stream, started, Duration::from_secs(10)).await.expect("closed");
    assert!(after < Duration::from_secs(4), "closed after {after:?}, pinged at {pinged:?}");
}

/// A HEADERS frame (END_STREAM | END_HEADERS) for `GET path` on `stream`, HPACK without
/// Huffman: `:method GET` and `:scheme http` indexed, `:path` and `:authority` literal.
fn headers_frame(stream: u32, path: &str) -> Vec<u8> {
    let mut block = vec![0x82, 0x86, 0x44, path.len() as u8];
    block.extend_from_slice(path.as_bytes());
    block.extend_from_slice(&[0x41, 1, b'x']);
    let len = block.len() as u32;
    let mut frame = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, 1, 0x5];
    frame.extend_from_slice(&stream.to_be_bytes());
    frame.extend_from_slice(&block);
    frame
}

/// One frame: (type, flags, stream, payload); `None` at EOF or on an error.
async fn read_frame(stream: &mut TcpStream) -> Option<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    stream.read_exact(&mut head).await.ok()?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).await.ok()?;
    Some((head[3], head[4], id, payload))
}

/// Reads frames until one on `id` ends its stream (END_STREAM on HEADERS or DATA); when.
async fn read_until_end_of_stream(stream: &mut TcpStream, id: u32) -> Instant {
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(5), read_frame(stream)).await;
        let (kind, flags, on, _) = frame.expect("an answer within 5 s").expect("the connection stays open");
        if on == id && (kind == 0 || kind == 1) && flags & 1 == 1 {
            return Instant::now();
        }
    }
}
