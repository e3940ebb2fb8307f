//! `POST /v1/feedback`: labels for recorded decisions (`crate::feedback`). On the admin listener
//! (behind its token) any record; on the public listener only a tenant authenticated by its API
//! key, and only its own decisions. Labels this replica's store does not hold are offered to
//! `[feedback] peers`; the answer says what became of each.

use super::app::{App, Role};
use crate::error::{json_response, ApiError};
use crate::feedback::forward::{FORWARDED, TENANT_SCOPE};
use crate::feedback::{parse_labels, Outcome, Target};
use crate::web;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use serde_json::json;

/// Answers 200 `{"results": [{record_id, request_id, outcome, replica?}]}`, one per label in
/// the order given; a single label (an object, not an array) whose record is nowhere is a 404
/// naming its id. 404 `not_found` without the audit trail; 401 on the public listener without
/// a tenant's API key; 422 naming a bad field; 503 when a peer that might hold a record could
/// not be asked, or the audit writer is busy (retry: labels are idempotent).
pub(super) async fn feedback(app: &App, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, ApiError> {
    let g = &app.gateway;
    let (Some(audit), Some(feedback)) = (&g.audit, &g.feedback) else {
        return Err(ApiError::NotFound {
            path: "/v1/feedback (the audit trail is off: labels join its records)".into(),
        });
    };
    let (parts, body) = req.into_parts();
    let (scope, forwarded) = match &app.role {
        // The admin token was checked: a forwarding replica's scope header is trusted.
        Role::Admin { .. } => (
            parts.headers.get(TENANT_SCOPE).and_then(|v| v.to_str().ok()).map(str::to_string),
            parts.headers.contains_key(FORWARDED),
        ),
        Role::Public { .. } => {
            let identity = g.tenants.resolve(&parts.headers, None, None)?;
            match (identity.source, identity.name) {
                (crate::tenant::Source::ApiKey, Some(tenant)) => (Some(tenant), false),
                _ => return Err(ApiError::Unauthorized),
            }
        }
    };
    web::require_json(&parts.headers)?;
    let bytes = web::read_body(&parts.headers, body, app.server.max_body_bytes).await?;
    let mut labels = parse_labels(&bytes)?;
    for label in &mut labels {
        label.tenant_scope = scope.clone();
    }
    let mut applied = audit.feedback(labels.clone()).await?;
    let unknown = applied.iter().any(|a| a.outcome == Outcome::Unknown);
    let forwarding = unknown && !forwarded && !feedback.peers.is_empty();
    let reached =
        if forwarding { feedback.peers.forward(&labels, &mut applied, scope.as_deref()).await } else { Ok(()) };
    feedback.counted(&labels, &applied);
    if let Err(unreachable) = reached {
        tracing::warn!(peer = %unreachable.0, "a label's record may be on a replica that did not answer");
        return Err(ApiError::Shed {
            reason: format!("a replica that may hold the record did not answer ({}); retry", unreachable.0),
            retry_after_s: 1,
        });
    }
    let single = bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'[');
    if let (true, Some(label)) = (single && applied[0].outcome == Outcome::Unknown, labels.first()) {
        let field = if matches!(label.target, Target::RecordId(_)) { "record_id" } else { "request_id" };
        return Err(ApiError::UnknownRecord { field, id: label.target.id().to_string() });
    }
    Ok(json_response(StatusCode::OK, &json!({ "results": applied })))
}
