//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>) in and out: the client's
//! `traceparent`/`tracestate` read with OpenTelemetry's `TraceContextPropagator`, the context
//! written onto a request tiergate sends (to the app, to a model server), and the
//! `traceresponse` header (Trace Context Level 2) that tells the client which trace its
//! request is in.

use http::{HeaderMap, HeaderValue};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry::Context;
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// `traceparent` (W3C Trace Context).
pub const TRACEPARENT: &str = "traceparent";
/// `tracestate` (W3C Trace Context).
pub const TRACESTATE: &str = "tracestate";
/// `traceresponse` (W3C Trace Context Level 2): the trace and span a server made of the request.
pub const TRACERESPONSE: &str = "traceresponse";

/// The client's span context, when its `traceparent` is valid (one header; version, ids not
/// all zero, lower-case hex of the right lengths, flags); its `tracestate` comes with it. `None`
/// for an absent or invalid one: the caller starts a new trace and never passes the invalid one
/// on.
pub fn extract(headers: &HeaderMap) -> Option<SpanContext> {
    let mut values = headers.get_all(TRACEPARENT).iter();
    let (Some(value), None) = (values.next(), values.next()) else { return None };
    if !well_formed(value.to_str().ok()?) {
        return None;
    }
    let cx = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid().then(|| sc.clone())
}

/// The shape W3C Trace Context §3.2 requires, which the propagator checks only in part (it
/// takes a short trace id or a `+` in the version): `version-trace_id-parent_id-flags` in
/// lower-case hex of 2, 32, 16 and 2 digits, version `ff` forbidden, nothing more after version
/// `00` (a later version may append `-...`).
fn well_formed(value: &str) -> bool {
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let mut parts = value.split('-');
    let (Some(version), Some(trace_id), Some(parent_id), Some(flags)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let rest = parts.next();
    hex(version, 2)
        && version != "ff"
        && hex(trace_id, 32)
        && hex(parent_id, 16)
        && hex(flags, 2)
        && (rest.is_none() || version != "00")
}

/// Writes `sc` as `traceparent` (and `tracestate` when it has one) onto `headers`, replacing
/// whatever the client sent.
pub fn inject(sc: &SpanContext, headers: &mut HeaderMap) {
    headers.remove(TRACEPARENT);
    headers.remove(TRACESTATE);
    if !sc.is_valid() {
        return;
    }
    let cx = Context::new().with_remote_span_context(sc.clone());
    TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(headers));
    if headers.get(TRACESTATE).is_some_and(|v| v.is_empty()) {
        headers.remove(TRACESTATE);
    }
}

/// Writes the current OpenTelemetry context's span (set by the cascade around a model call,
/// [`opentelemetry::context::FutureExt::with_context`]) onto an outgoing request; nothing
/// when there is none (tracing off). For clients that cannot be handed the trace, such as the
/// gpu tier's model servers.
pub fn inject_current(headers: &mut HeaderMap) {
    let cx = Context::current();
    let span = cx.span();
    let sc = span.span_context();
    if sc.is_valid() {
        inject(sc, headers);
    }
}

/// The `traceresponse` value for `sc`: `00-{trace-id}-{span-id}-{flags}`.
pub fn traceresponse(sc: &SpanContext) -> HeaderValue {
    let value = format!("00-{}-{}-{:02x}", sc.trace_id(), sc.span_id(), sc.trace_flags().to_u8());
    // Hex digits and dashes only.
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static(""))
}
