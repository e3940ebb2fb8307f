//! The phases of a screened request, written once, for a proxy route (`Proxy::handle`) and for
//! `TierGateLayer` alike:
//!
//! 1. **read** ([`screen::read`]): the text, features and tenant from the route's sources; the
//!    body kept for forwarding;
//! 2. **decide** ([`Port::decide`]): the gateway's cascade under the route's policy;
//! 3. **record** ([`Port::record`]): the request's one audit record — its decision, or that it
//!    went on unscreened;
//! 4. **dispose** ([`dispose`]): the route's action mapping and failure mode: go on, or the error
//!    to answer (403 blocked, 503 shed, the screening error when failing closed).
//!
//! Then each door's last phase: forwarding to the app (`forward.rs`) or calling the inner service.

use super::config::{Disposition, FailMode, OverloadMode};
use super::port::{Handled, Port};
use super::screen::{self, Outgoing, Screen};
use crate::audit::record::Event;
use crate::audit::Kind;
use crate::decision::Decision;
use crate::error::ApiError;
use crate::policy::Action;
use crate::trace::{attr, Trace};
use crate::web::ServerConfig;
use bytes::Bytes;
use http::request::Parts;
use opentelemetry::KeyValue;

/// What screening concluded, when the request goes on to the app.
pub enum Screening {
    Decided(Decision),
    /// Fail-open: screening could not run, for this reason.
    Failed(String),
}

impl Screening {
    /// How a request that went on with this is counted once it reached the app.
    pub fn handled(&self) -> Handled {
        match self {
            Screening::Decided(_) => Handled::Forwarded,
            Screening::Failed(_) => Handled::Unscreened,
        }
    }
}

/// One door's screening setup: its name (the route, or the Layer's label in metrics and logs),
/// its `[routes.screen]` rule and the server's limits (text limit, default deadline, body-read
/// timeout).
pub struct Door<'a> {
    pub port: &'a Port,
    pub name: &'a str,
    pub screen: &'a Screen,
    pub server: &'a ServerConfig,
}

/// Runs the four phases over one request: `Ok` with what screening concluded and the body to
/// forward, or the error the door answers (blocked, shed, refused; counted here).
pub async fn screen<B>(
    door: &Door<'_>,
    parts: &Parts,
    body: B,
    request_id: &str,
) -> Result<(Screening, Outgoing<B>), ApiError>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let (request, outgoing) = screen::read(door.port.tenants(), door.server, door.screen, parts, body).await;
    let broken = matches!(outgoing, Outgoing::Broken);
    let policy = door.screen.config.policy.as_deref();
    // The front door's trace, when it began one (the Layer's requests have none).
    let trace = parts.extensions.get::<Trace>().cloned().unwrap_or_default();
    let mut outcome = match request {
        Ok(mut request) => {
            request.trace = trace.clone();
            door.port.decide(policy, request, request_id.to_string()).await
        }
        Err(e) => Err(e),
    };
    // What the client controls is refused in either mode (`ApiError::may_fail_open`): a client
    // must not be able to choose to go unscreened by sending a bad request; nor can a request
    // whose body is lost go on in any mode.
    let fails_open = door.screen.config.on_error == FailMode::Open && !broken;
    let unscreened = outcome.as_ref().err().filter(|e| fails_open && e.may_fail_open()).map(ApiError::to_string);
    let span = trace.start("record");
    let recorded = record(door, request_id, &outcome, unscreened.as_deref());
    trace.end(span, || vec![KeyValue::new(attr::AUDITED, door.port.audits() && recorded.is_ok())], None);
    let record_id = recorded?;
    if let Ok(decision) = &mut outcome {
        // What the app labels the decision by (`POST /v1/feedback`), from `x-tiergate-record-id`.
        decision.record_id = record_id;
    }
    let screening = dispose(door, outcome, unscreened)?;
    Ok((screening, outgoing))
}

/// The record phase: a decision, or a request going on unscreened, gets its audit record (kind
/// `screen`); a full audit queue under `on_full = "block"` turns either into a 503 before
/// anything else. A refused request has no record (the client's error is its answer). Returns
/// the record's id (`None` without the audit trail).
fn record(
    door: &Door<'_>,
    request_id: &str,
    outcome: &Result<Decision, ApiError>,
    unscreened: Option<&str>,
) -> Result<Option<String>, ApiError> {
    let event = match (outcome, unscreened) {
        (Ok(decision), _) => Event::Decided { kind: Kind::Screen, decision },
        (Err(_), Some(reason)) => {
            let policy_version = door.port.policy(door.screen.config.policy.as_deref()).version.clone();
            Event::Unscreened { request_id, policy_version, reason }
        }
        (Err(_), None) => return Ok(None),
    };
    door.port.record(event, door.name)
}

/// The dispose phase: applies the route's action mapping and failure mode. `Ok` goes on, `Err`
/// is answered (blocked: 403 with the decision; shed: 503; refused: the screening error). Logs
/// and counts what does not go on.
fn dispose(
    door: &Door<'_>,
    outcome: Result<Decision, ApiError>,
    unscreened: Option<String>,
) -> Result<Screening, ApiError> {
    let (route, config) = (door.name, &door.screen.config);
    match outcome {
        Ok(decision) => {
            let disposition = match decision.action {
                Action::Allow => Disposition::Forward,
                Action::Review => config.on_review,
                Action::Block => config.on_block,
            };
            tracing::info!(
                route, request_id = %decision.request_id, action = decision.action.as_str(),
                risk_score = decision.risk_score, tier = decision.tier.as_str(), rule = ?decision.rule,
                forwarded = disposition == Disposition::Forward, "screened"
            );
            if disposition == Disposition::Block {
                door.port.count(route, Handled::Blocked);
                return Err(blocked(&decision));
            }
            if decision.overloaded && config.on_overload == OverloadMode::Shed {
                door.port.count(route, Handled::Shed);
                let reason = "no model tier had the capacity to judge the request (route on_overload = shed)".into();
                return Err(ApiError::Shed { reason, retry_after_s: 1 });
            }
            Ok(Screening::Decided(decision))
        }
        Err(e) => match unscreened {
            Some(reason) => {
                tracing::warn!(route, error = %e, "screening failed; forwarded unscreened (fail-open)");
                Ok(Screening::Failed(reason))
            }
            None => {
                tracing::warn!(route, error = %e, "screening failed; request refused");
                door.port.count(route, Handled::Refused);
                Err(e)
            }
        },
    }
}

/// The 403 for a blocked request, with the decision in the body.
fn blocked(d: &Decision) -> ApiError {
    let message = match &d.rule {
        Some(rule) => format!("blocked by policy: rule `{rule}` (risk score {:.2})", d.risk_score),
        None => format!("blocked by policy: risk score {:.2} from the {} tier", d.risk_score, d.tier.as_str()),
    };
    ApiError::Blocked { message, decision: Box::new(serde_json::to_value(d).unwrap_or_default()) }
}
