//! One client connection from accept to close, whatever its protocol: the deadlines that keep a
//! socket from holding a `max_connections` slot while costing its client nothing.
//!
//! hyper bounds an HTTP/1 request head once it has started to read one, but nothing bounds the
//! time before that: hyper-util's protocol detection (the first 24 bytes, to tell the HTTP/2
//! preface from HTTP/1) runs no timer, and HTTP/2 has no header-read or idle timeout at all, so a
//! silent socket, half a preface, or a preface and SETTINGS with no stream stayed open for
//! ever. Here every connection counts its requests in flight ([`Activity`]); while none is in
//! flight a timer runs ([`quiet`]): `header_read_timeout_ms` from accept until the first request
//! head has arrived (whole: hyper calls the service only then), `idle_timeout_ms` after each
//! request, counted from its end. When it fires the connection is shut down gracefully (HTTP/2
//! GOAWAY, HTTP/1 closes, detection is cancelled) and dropped if that has not finished after
//! [`CLOSE_GRACE`] more of quiet. A request in flight is never cut by these timers: its own
//! timeouts bound it.

use crate::web::BoxError;
use bytes::Bytes;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::watch;

/// How long a connection told to close may take to do so (a GOAWAY's ping round trip, a
/// client that stopped reading), counted while nothing is in flight, before it is dropped.
pub const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// What a connection is doing: requests in flight now, and how many have started.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    in_flight: usize,
    started: u64,
}

/// The requests of one connection, shared by its service (which starts them) and its
/// watchdog (which waits for quiet).
#[derive(Debug)]
pub struct Activity(watch::Sender<Counts>);

impl Activity {
    pub fn new() -> Arc<Activity> {
        Arc::new(Activity(watch::Sender::new(Counts::default())))
    }

    /// A request has arrived (its head read whole); it counts until the guard is dropped.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.0.send_modify(|c| {
            c.in_flight += 1;
            c.started += 1;
        });
        InFlight(Arc::clone(self))
    }
}

/// One request in flight: from its head until its response body has been sent (or dropped).
#[derive(Debug)]
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0 .0.send_modify(|c| c.in_flight = c.in_flight.saturating_sub(1));
    }
}

/// Resolves once the connection has had nothing in flight for `first` (before any request
/// arrived) or `idle` (after one): any request starting or ending restarts the count.
pub async fn quiet(activity: &Activity, first: Duration, idle: Duration) {
    let mut changes = activity.0.subscribe();
    loop {
        let counts = *changes.borrow_and_update();
        if counts.in_flight > 0 {
            // The sender lives in `activity`, borrowed for this whole future: never closed.
            let _ = changes.changed().await;
            continue;
        }
        let limit = if counts.started == 0 { first } else { idle };
        tokio::select! {
            _ = tokio::time::sleep(limit) => return,
            _ = changes.changed() => {}
        }
    }
}

/// A response body that keeps its request counted as in flight until it has been sent: a
/// streamed answer (SSE from an app) is activity, however long it lasts.
pub struct Counted<B> {
    body: B,
    _in_flight: InFlight,
}

impl<B> Counted<B> {
    pub fn new(body: B, in_flight: InFlight) -> Counted<B> {
        Counted { body, _in_flight: in_flight }
    }
}

impl<B> http_body::Body for Counted<B>
where
    B: http_body::Body<Data = Bytes, Error = BoxError> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Serves `conn` until it ends, asking it to finish (`close`: hyper's graceful shutdown) when it
/// has been quiet too long ([`quiet`]) or when `shutdown` turns true (the server is stopping);
/// then it gets [`CLOSE_GRACE`] of quiet to finish before it is dropped (`None`).
pub async fn drive<C: Future>(
    conn: C,
    close: impl FnOnce(Pin<&mut C>),
    activity: &Activity,
    first: Duration,
    idle: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> Option<C::Output> {
    tokio::pin!(conn);
    let stopping = async {
        // `changed` errs once the server dropped its sender: stopping too.
        while !*shutdown.borrow_and_update() {
            if shutdown.changed().await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        out = conn.as_mut() => return Some(out),
        _ = quiet(activity, first, idle) => tracing::debug!("closing a connection quiet for too long"),
        _ = stopping => {}
    }
    close(conn.as_mut());
    tokio::select! {
        out = conn => Some(out),
        _ = quiet(activity, CLOSE_GRACE, CLOSE_GRACE) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn quiet_counts_only_time_with_nothing_in_flight() {
        let activity = Activity::new();
        let (first, idle) = (Duration::from_secs(5), Duration::from_secs(60));
        let start = tokio::time::Instant::now();
        quiet(&activity, first, idle).await;
        assert_eq!(start.elapsed(), first, "no request: the head deadline");

        let request = activity.begin();
        let waiting = tokio::spawn({
            let activity = Arc::clone(&activity);
            async move { quiet(&activity, first, idle).await }
        });
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(!waiting.is_finished(), "a request in flight is never idle");
        let ended = tokio::time::Instant::now();
        drop(request);
        waiting.await.unwrap();
        assert_eq!(ended.elapsed(), idle, "idle counted from the end of the last request");
    }
}
