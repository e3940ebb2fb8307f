//! The audit record: one JSON object per decision, as stored in `audit.db`, shipped to Kafka and
//! printed by `tiergate audit` (schema: docs/operations.md). [`Draft`] is what the request path
//! hands to the writer: a few clones and no formatting, since the text's hash or redaction and
//! the JSON are made on the writer thread, off the request path.

use super::text::{AuditText, TextPolicy};
use crate::action::Action;
use crate::decision::{Decision, Label, Step, TierName};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// What made the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// `POST /v1/classify`.
    Classify,
    /// A screened proxy route or the tower layer: allowed, reviewed, blocked, or forwarded
    /// unscreened after screening failed on a fail-open route.
    Screen,
    /// The stream guard ended an app's response.
    StreamCut,
    /// The shadow policy disagreed with the live one (the record is the candidate's decision).
    Shadow,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Classify => "classify",
            Kind::Screen => "screen",
            Kind::StreamCut => "stream_cut",
            Kind::Shadow => "shadow",
        }
    }
}

/// A record's `action`: the decision's, or `unscreened` for a request a fail-open route forwarded
/// without a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordedAction {
    Allow,
    Review,
    Block,
    Unscreened,
}

impl RecordedAction {
    /// The stored and shipped spelling (the `action` column, the JSON field).
    pub fn as_str(self) -> &'static str {
        match self {
            RecordedAction::Allow => "allow",
            RecordedAction::Review => "review",
            RecordedAction::Block => "block",
            RecordedAction::Unscreened => "unscreened",
        }
    }
}

impl From<Action> for RecordedAction {
    fn from(action: Action) -> Self {
        match action {
            Action::Allow => RecordedAction::Allow,
            Action::Review => RecordedAction::Review,
            Action::Block => RecordedAction::Block,
        }
    }
}

/// A record's `tier`: the stage whose verdict stands, or `unscreened` (no decision).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordedTier {
    Cpu,
    Gpu,
    Rules,
    Guard,
    /// The features model raised the action (`[features_model] combine = "max"`).
    Features,
    /// The confirm model confirmed an unsure cpu verdict, which stands.
    Confirm,
    Unscreened,
}

impl RecordedTier {
    /// The stored and shipped spelling (the `tier` column, the JSON field).
    pub fn as_str(self) -> &'static str {
        match self {
            RecordedTier::Cpu => "cpu",
            RecordedTier::Gpu => "gpu",
            RecordedTier::Rules => "rules",
            RecordedTier::Guard => "guard",
            RecordedTier::Features => "features",
            RecordedTier::Confirm => "confirm",
            RecordedTier::Unscreened => "unscreened",
        }
    }
}

impl From<TierName> for RecordedTier {
    fn from(tier: TierName) -> Self {
        match tier {
            TierName::Cpu => RecordedTier::Cpu,
            TierName::Gpu => RecordedTier::Gpu,
            TierName::Rules => RecordedTier::Rules,
            TierName::Guard => RecordedTier::Guard,
            TierName::Features => RecordedTier::Features,
            TierName::Confirm => RecordedTier::Confirm,
        }
    }
}

/// The model behind a decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelRef {
    pub name: String,
    /// sha256 of the model directory's `MANIFEST.sha256` (one digest for weights, tokenizer,
    /// calibration and OOD data), lower-case hex; `null` for a model server tiergate only calls.
    pub sha256: Option<String>,
}

/// One decision, as the audit trail keeps it. Field by field: docs/operations.md.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// This record's own id, a UUIDv7 (time-ordered, unique across restarts and replicas): what
    /// a consumer de-duplicates by when a record arrives twice. Records written before it
    /// existed read as empty.
    #[serde(default)]
    pub record_id: String,
    pub request_id: String,
    /// When the decision was made, ms since the Unix epoch.
    pub unix_ms: u64,
    pub kind: Kind,
    pub tenant: Option<String>,
    /// The proxy route (or tower layer) name; `null` for `/v1/classify`.
    pub route: Option<String>,
    pub policy_version: String,
    /// The policy scenario the request was decided in (`/v1/classify` with `x-tiergate-scenario`);
    /// absent for none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario: Option<String>,
    pub model: ModelRef,
    /// `allow`, `review`, `block`, or `unscreened`.
    pub action: RecordedAction,
    /// `null` only for `unscreened`.
    pub label: Option<Label>,
    /// `null` only for `unscreened`.
    pub risk_score: Option<f64>,
    /// The cpu model's OOD score, when it ran.
    pub ood_score: Option<f64>,
    /// The stage whose verdict stands (`cpu`, `gpu`, `rules`, `guard`), or `unscreened`.
    pub tier: RecordedTier,
    /// Every stage tried, as a decision's `path` serialises.
    pub path: Vec<serde_json::Value>,
    /// Ids of the rules that matched (rules stage, guards, allow-list), in path order.
    pub rules: Vec<String>,
    /// Time to decide, µs.
    pub latency_us: u64,
    /// ISO 639-3 code of the text's language ("und" when unreliable).
    pub lang: Option<String>,
    /// Length of the screened text, Unicode scalar values.
    pub text_chars: u64,
    pub text: AuditText,
    /// The request's trace id (32 hex digits), when it was traced (`[tracing]`): the way from a
    /// record to its trace. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

/// A record before the writer renders its text and path.
#[derive(Debug, Clone)]
pub struct Draft {
    /// The record's own id (a UUIDv7), made with the draft so that the response can name it.
    pub record_id: String,
    pub request_id: String,
    pub unix_ms: u64,
    pub kind: Kind,
    pub tenant: Option<String>,
    pub route: Option<String>,
    pub policy_version: String,
    pub scenario: Option<String>,
    pub model: ModelRef,
    pub action: RecordedAction,
    pub label: Option<Label>,
    pub risk_score: Option<f64>,
    pub tier: RecordedTier,
    pub path: Vec<Step>,
    /// A path entry the decision types cannot express (why screening did not run).
    pub note: Option<serde_json::Value>,
    pub latency_us: u64,
    pub lang: Option<&'static str>,
    pub text: Arc<str>,
    /// The request's trace id, when it was traced.
    pub trace_id: Option<String>,
}

/// Now, ms since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A UUIDv7 (RFC 9562) for a record decided at `unix_ms`: the time, then 74 random bits —
/// taken from a v4, the generator this build has — so that ids sort by time and do not repeat
/// across restarts or instances.
pub fn record_id(unix_ms: u64) -> String {
    let random = uuid::Uuid::new_v4();
    let bytes: &[u8; 10] = random.as_bytes()[..10].try_into().expect("a UUID has 16 bytes");
    uuid::Builder::from_unix_timestamp_millis(unix_ms, bytes).into_uuid().to_string()
}

/// What a record is of: each way a request ends up in the trail, built into a [`Draft`] in
/// one place ([`Draft::new`]).
pub enum Event<'a> {
    /// A decision: of `POST /v1/classify` (`Classify`), a proxy route's screen (`Screen`), or a
    /// shadow candidate that disagreed with the live policy (`Shadow`).
    Decided { kind: Kind, decision: &'a Decision },
    /// A request a fail-open route forwarded without a decision, because screening failed for
    /// `reason` (kind `screen`; action and tier `unscreened`).
    Unscreened { request_id: &'a str, policy_version: String, reason: &'a str },
    /// A response the stream guard ended (kind `stream_cut`): the rules verdict `step` on the
    /// window of the app's text that matched.
    StreamCut {
        request_id: &'a str,
        tenant: Option<String>,
        policy_version: &'a str,
        action: Action,
        step: Step,
        lang: &'static str,
        text: String,
    },
}

impl Draft {
    /// The record of `event`; `route`: the proxy route or layer that screened (`None` for the
    /// classify endpoint); `model`: the model the record names.
    pub fn new(event: Event<'_>, route: Option<&str>, model: ModelRef) -> Draft {
        let route = route.map(str::to_string);
        let unix_ms = now_ms();
        let record_id = record_id(unix_ms);
        match event {
            Event::Decided { kind, decision: d } => Draft {
                record_id,
                request_id: d.request_id.clone(),
                unix_ms,
                kind,
                tenant: d.subject.tenant.clone(),
                route,
                policy_version: d.policy_version.clone(),
                scenario: d.scenario.clone(),
                model,
                action: d.action.into(),
                label: Some(d.label),
                risk_score: Some(d.risk_score),
                tier: d.tier.into(),
                path: d.path.clone(),
                note: None,
                latency_us: d.latency_us,
                lang: (!d.subject.lang.is_empty()).then_some(d.subject.lang),
                text: Arc::clone(&d.subject.text),
                trace_id: d.subject.trace_id.clone(),
            },
            Event::Unscreened { request_id, policy_version, reason } => Draft {
                record_id,
                request_id: request_id.to_string(),
                unix_ms,
                kind: Kind::Screen,
                tenant: None,
                route,
                policy_version,
                scenario: None,
                model,
                action: RecordedAction::Unscreened,
                label: None,
                risk_score: None,
                tier: RecordedTier::Unscreened,
                path: Vec::new(),
                note: Some(
                    serde_json::json!({"outcome": RecordedTier::Unscreened.as_str(), "reason": reason, "latency_us": 0}),
                ),
                latency_us: 0,
                lang: None,
                text: Arc::from(""),
                trace_id: None,
            },
            Event::StreamCut { request_id, tenant, policy_version, action, step, lang, text } => Draft {
                record_id,
                request_id: request_id.to_string(),
                unix_ms,
                kind: Kind::StreamCut,
                tenant,
                route,
                policy_version: policy_version.to_string(),
                scenario: None,
                model,
                action: action.into(),
                label: step.risk_score.map(Label::from_risk_score),
                risk_score: step.risk_score,
                tier: step.tier.into(),
                latency_us: step.latency_us,
                path: vec![step],
                note: None,
                lang: Some(lang),
                text: Arc::from(text),
                trace_id: None,
            },
        }
    }

    /// The record, with the text as `text` keeps it.
    pub fn render(self, text: &TextPolicy) -> AuditRecord {
        let mut rules: Vec<String> = Vec::new();
        for rule in self.path.iter().filter_map(|s| s.rule.as_ref()) {
            if !rules.contains(rule) {
                rules.push(rule.clone());
            }
        }
        let ood_score = self.path.iter().find_map(|s| s.ood_score);
        let mut path: Vec<serde_json::Value> =
            self.path.iter().map(|s| serde_json::to_value(s).unwrap_or_default()).collect();
        path.extend(self.note);
        AuditRecord {
            record_id: self.record_id,
            request_id: self.request_id,
            unix_ms: self.unix_ms,
            kind: self.kind,
            tenant: self.tenant,
            route: self.route,
            policy_version: self.policy_version,
            scenario: self.scenario,
            model: self.model,
            action: self.action,
            label: self.label,
            risk_score: self.risk_score,
            ood_score,
            tier: self.tier,
            path,
            rules,
            latency_us: self.latency_us,
            lang: self.lang.map(str::to_string),
            text_chars: self.text.chars().count() as u64,
            text: text.render(&self.text),
            trace_id: self.trace_id,
        }
    }
}
