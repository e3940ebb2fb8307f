//! OpenTelemetry traces: one trace per request, whose root span (the HTTP server span) carries
//! the decision, with a span per stage under it; W3C Trace Context in and out; export over
//! OTLP/HTTP (protobuf) with the official exporter (docs/operations.md, "Traces").
//!
//! A request's spans are kept in memory ([`Trace`]) until the response is known, then the whole
//! trace is exported or dropped at once ([`Trace::finish`]): a trace the parent-based ratio
//! sampler chose, or one [`Trace::keep`] marked (a blocked, errored or over-deadline decision)
//! whatever the ratio. Every span is therefore recorded, and only kept traces cost an export.
//! The export queue is bounded; a full queue or a failed export drops spans and counts them
//! (`tiergate_trace_spans_dropped_total`), never slowing or failing a request.
//!
//! Files by concern: this one (a request's trace and its spans), [`config`] (`[tracing]`),
//! [`context`] (W3C headers), `export` ([`Tracer`]: sampler, queue and exporter task), `client`
//! (the exporter's HTTP client, on tiergate's hyper), [`attr`] (attribute names).
//!
//! No message text ever goes into a span: stages record ids, counts, scores, outcomes, rule
//! ids and addresses.

pub mod attr;
mod client;
pub mod config;
pub mod context;
mod export;

pub use config::TracingConfig;
pub use export::{TraceMetrics, Tracer};

use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags};
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use std::borrow::Cow;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// One request's trace; cheap to clone (shared). [`Trace::OFF`] (tracing off, or a replay that
/// must not record) makes every method a no-op.
#[derive(Clone, Default)]
pub struct Trace {
    inner: Option<Arc<Inner>>,
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            None => f.write_str("Trace(off)"),
            Some(i) => write!(f, "Trace({}-{})", i.root.trace_id(), i.root.span_id()),
        }
    }
}

struct Inner {
    shared: Arc<export::Shared>,
    /// The root span's own context: trace id (the client's, or new), span id, the sampler's
    /// flags and the client's `tracestate`.
    root: SpanContext,
    /// The client's span, when its `traceparent` was valid.
    parent: Option<SpanId>,
    kind: SpanKind,
    start: SystemTime,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    name: Cow<'static, str>,
    attributes: Vec<KeyValue>,
    spans: Vec<SpanData>,
    /// Why this trace is exported whatever the ratio (the first reason given).
    keep: Option<&'static str>,
    error: Option<String>,
}

/// A stage's span, started: its id (a child's parent, or what an outgoing request carries) and
/// start time. Ended with [`Trace::end`]; one that is never ended is not exported.
#[derive(Debug)]
pub struct Span {
    id: SpanId,
    name: &'static str,
    kind: SpanKind,
    start: SystemTime,
}

impl Trace {
    /// Tracing off: nothing is recorded.
    pub const OFF: Trace = Trace { inner: None };

    /// Whether this request is traced at all.
    pub fn is_on(&self) -> bool {
        self.inner.is_some()
    }

    /// The root span's context (what the `traceresponse` header says); `None` when off.
    pub fn root(&self) -> Option<&SpanContext> {
        self.inner.as_ref().map(|i| &i.root)
    }

    /// The trace id, 32 lower-case hex digits; `None` when off.
    pub fn trace_id(&self) -> Option<String> {
        self.root().map(|sc| sc.trace_id().to_string())
    }

    /// Starts a stage span (kind internal) under the root span.
    pub fn start(&self, name: &'static str) -> Span {
        self.start_kind(name, SpanKind::Internal)
    }

    /// Starts a span for a call tiergate makes to another service (kind client): its context
    /// goes on the outgoing request ([`Trace::context_of`]).
    pub fn start_client(&self, name: &'static str) -> Span {
        self.start_kind(name, SpanKind::Client)
    }

    fn start_kind(&self, name: &'static str, kind: SpanKind) -> Span {
        match &self.inner {
            None => Span { id: SpanId::INVALID, name, kind, start: SystemTime::UNIX_EPOCH },
            Some(i) => Span { id: i.shared.new_span_id(), name, kind, start: SystemTime::now() },
        }
    }

    /// `span`'s context, to send on the request it makes (invalid when off: nothing is sent).
    pub fn context_of(&self, span: &Span) -> SpanContext {
        match &self.inner {
            None => SpanContext::NONE,
            Some(i) => {
                SpanContext::new(i.root.trace_id(), span.id, i.root.trace_flags(), false, i.root.trace_state().clone())
            }
        }
    }

    /// `span`'s context as the current OpenTelemetry context of a future
    /// ([`opentelemetry::context::FutureExt::with_context`]), for a call that reads it
    /// ([`context::inject_current`]).
    pub fn otel_context(&self, span: &Span) -> opentelemetry::Context {
        use opentelemetry::trace::TraceContextExt;
        match &self.inner {
            None => opentelemetry::Context::new(),
            Some(_) => opentelemetry::Context::new().with_remote_span_context(self.context_of(span)),
        }
    }

    /// Ends `span` now with the attributes `attributes` makes (called only when traced, so an
    /// untraced request builds none); `error`: its status is an error with this message.
    pub fn end(&self, span: Span, attributes: impl FnOnce() -> Vec<KeyValue>, error: Option<String>) {
        let Some(i) = &self.inner else { return };
        let status = error.map_or(Status::Unset, Status::error);
        let data =
            i.span_data(span.id, i.root.span_id(), span.name.into(), span.kind, span.start, attributes(), status);
        i.lock().spans.push(data);
    }

    /// Records a span that ran from `start` to `end` (a stage whose attributes are known only
    /// later, such as the language of the canonical text).
    pub fn record(&self, name: &'static str, start: SystemTime, end: SystemTime, attributes: Vec<KeyValue>) {
        let Some(i) = &self.inner else { return };
        let mut data = i.span_data(
            i.shared.new_span_id(),
            i.root.span_id(),
            name.into(),
            SpanKind::Internal,
            start,
            attributes,
            Status::Unset,
        );
        data.end_time = end;
        i.lock().spans.push(data);
    }

    /// Sets attributes of the root span (a key set again takes the new value).
    pub fn set(&self, attributes: impl IntoIterator<Item = KeyValue>) {
        if let Some(i) = &self.inner {
            let mut state = i.lock();
            for kv in attributes {
                state.attributes.retain(|old| old.key != kv.key);
                state.attributes.push(kv);
            }
        }
    }

    /// Names the root span (`{method} {route}`, HTTP semantic conventions).
    pub fn rename(&self, name: impl Into<Cow<'static, str>>) {
        if let Some(i) = &self.inner {
            i.lock().name = name.into();
        }
    }

    /// Exports this trace whatever the sampling ratio; `why` (`blocked`, `error`, `deadline`)
    /// is the root span's `tiergate.trace.kept`. The first reason given stands.
    pub fn keep(&self, why: &'static str) {
        if let Some(i) = &self.inner {
            i.lock().keep.get_or_insert(why);
        }
    }

    /// Marks the root span as failed with `message` (and keeps the trace).
    pub fn fail(&self, message: impl Into<String>) {
        if let Some(i) = &self.inner {
            let mut state = i.lock();
            state.error.get_or_insert_with(|| message.into());
            state.keep.get_or_insert(attr::KEPT_ERROR);
        }
    }

    /// The HTTP response the request got: `http.response.status_code` on the root span; a 5xx
    /// fails the trace (`error.type` the status, kept), a 408 or 504 keeps it as over-deadline.
    pub fn respond(&self, status: http::StatusCode) {
        if !self.is_on() {
            return;
        }
        self.set([KeyValue::new(attr::HTTP_RESPONSE_STATUS_CODE, i64::from(status.as_u16()))]);
        if matches!(status.as_u16(), 408 | 504) {
            self.keep(attr::KEPT_DEADLINE);
        }
        if status.is_server_error() {
            self.set([KeyValue::new(attr::ERROR_TYPE, status.as_u16().to_string())]);
            self.fail(status.canonical_reason().unwrap_or("server error"));
        }
    }

    /// Ends the root span now and hands the trace to the export queue when it is sampled or
    /// kept; otherwise drops it. Later calls do nothing.
    pub fn finish(&self) {
        let Some(i) = &self.inner else { return };
        let mut state = std::mem::take(&mut *i.lock());
        let sampled = i.root.is_sampled();
        let Some(kept) = state.keep.or(sampled.then_some("")) else { return };
        if state.name.is_empty() {
            return; // already finished
        }
        if !kept.is_empty() {
            state.attributes.push(KeyValue::new(attr::TRACE_KEPT, kept));
        }
        let status = state.error.map_or(Status::Unset, Status::error);
        let parent = i.parent.unwrap_or(SpanId::INVALID);
        let root = i.span_data(i.root.span_id(), parent, state.name, i.kind.clone(), i.start, state.attributes, status);
        let mut spans = state.spans;
        spans.push(root);
        for span in &mut spans {
            // An exported trace is a sampled one, whatever the flag said at the start.
            span.span_context = SpanContext::new(
                span.span_context.trace_id(),
                span.span_context.span_id(),
                TraceFlags::SAMPLED,
                false,
                span.span_context.trace_state().clone(),
            );
            span.parent_span_is_remote = span.parent_span_id == parent && i.parent.is_some();
        }
        i.shared.submit(spans);
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[allow(clippy::too_many_arguments)]
    fn span_data(
        &self,
        id: SpanId,
        parent: SpanId,
        name: Cow<'static, str>,
        kind: SpanKind,
        start: SystemTime,
        attributes: Vec<KeyValue>,
        status: Status,
    ) -> SpanData {
        SpanData {
            span_context: SpanContext::new(
                self.root.trace_id(),
                id,
                self.root.trace_flags(),
                false,
                self.root.trace_state().clone(),
            ),
            parent_span_id: parent,
            parent_span_is_remote: false,
            span_kind: kind,
            name,
            start_time: start,
            end_time: SystemTime::now(),
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status,
            instrumentation_scope: self.shared.scope.clone(),
        }
    }
}

#[cfg(test)]
mod tests;
