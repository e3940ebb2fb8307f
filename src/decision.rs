//! The decision a request gets: the response body of `POST /v1/classify`, and what a screened
//! proxy route passes to the app in headers.

pub use crate::select::{Outcome, TierName};

use crate::action::Action;
use crate::select::{LoadSnapshot, Start};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Label {
    Ok,
    Risk,
}

impl Label {
    /// `risk` iff the risk score is at least 0.5 (the argmax of a two-class model).
    pub fn from_risk_score(risk_score: f64) -> Label {
        if risk_score >= 0.5 {
            Label::Risk
        } else {
            Label::Ok
        }
    }
}

/// One stage the request went through and why it was left (or that it decided).
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub tier: TierName,
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub risk_score: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ood_score: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The upstream server that answered (gpu tier, upstream backend).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// For a text read in several windows, the one that decided (the riskiest).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<crate::tier::WindowRef>,
    /// The model tier's verdict came from the verdict cache (`[cache]`): an earlier request with
    /// the same key paid the model call, or one in flight did (single flight). Omitted when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cached: bool,
    pub latency_us: u64,
}

impl Step {
    pub fn new(tier: TierName, outcome: Outcome, latency_us: u64) -> Step {
        Step {
            tier,
            outcome,
            confidence: None,
            risk_score: None,
            ood_score: None,
            reason: None,
            rule: None,
            endpoint: None,
            window: None,
            cached: false,
            latency_us,
        }
    }

    pub fn reason(mut self, reason: impl Into<String>) -> Step {
        self.reason = Some(reason.into());
        self
    }
}

/// The decision. `tier` is the stage whose verdict stands; `path` lists every stage tried.
#[derive(Debug, Clone, Serialize)]
pub struct Decision {
    pub request_id: String,
    /// The decision's audit record id (a UUIDv7), when the audit trail is on: what a label
    /// (`POST /v1/feedback`) names it by. Omitted without the trail.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record_id: Option<String>,
    pub label: Label,
    /// Calibrated probability of risk (model tiers) or the matching rule's score (rules).
    pub risk_score: f64,
    /// Calibrated probability of `label` when a model decided; `null` when rules decided
    /// (rule scores are declared, not calibrated probabilities).
    pub confidence: Option<f64>,
    pub action: Action,
    pub tier: TierName,
    /// The rule that decided, when `tier` is `rules` and a rule matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// Text signals with at least one match, when rules were consulted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signals: Option<std::collections::BTreeMap<String, i64>>,
    pub path: Vec<Step>,
    pub policy_version: String,
    /// The policy scenario (`[scenarios.NAME]`) the request was decided in; omitted for none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scenario: Option<String>,
    /// With a live A/B test (`[ab]`): the arm whose policy decided, `live` or `candidate`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arm: Option<Arm>,
    pub model: String,
    /// Time from the start of the decision to the response, µs.
    pub latency_us: u64,
    /// Rules decided because no model tier had the capacity to (queue full or its wait past
    /// the deadline, a doomed or timed-out job, utilisation or in-flight limits). Proxy routes
    /// choose what to do with such decisions (`on_overload`). Omitted when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub overloaded: bool,
    /// With `?explain=true`: why the request was routed as it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub explain: Option<Explain>,
    /// What the decision was about, for the audit trail; never part of a response.
    #[serde(skip)]
    pub subject: Subject,
}

/// The request a decision was made on, as the audit trail records it beside the decision.
/// Cheap to clone: the text is shared.
#[derive(Debug, Clone, Default)]
pub struct Subject {
    /// The text as the client sent it (not the canonical text the models read).
    pub text: std::sync::Arc<str>,
    pub tenant: Option<String>,
    /// ISO 639-3 code of the canonical text's language as the rules saw it ("und" when the
    /// guess is unreliable); empty when no stage asked.
    pub lang: &'static str,
    /// The request's trace id (32 hex digits), when it was traced (`[tracing]`).
    pub trace_id: Option<String>,
}

/// What `?explain=true` adds.
#[derive(Debug, Clone, Serialize)]
pub struct Explain {
    /// The final complexity score and each feature's contribution (with `ood` once the cpu tier
    /// ran; `start.complexity` is the score the starting tier was chosen by).
    pub complexity: crate::complexity::Complexity,
    /// The raw counts behind it.
    pub stats: crate::complexity::TextStats,
    /// The language and script of the canonical text (rule variable `lang`; the cpu tier's
    /// language gate).
    pub language: crate::text::Language,
    /// The signals snapshot routing used.
    pub signals: LoadSnapshot,
    /// The starting tier, why, and each model tier's eligibility.
    pub start: Start,
    /// Why the cpu model said what it said: each word's effect on its risk score (occlusion),
    /// largest first. Absent when the cpu model gave no score.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub attributions: Vec<Attribution>,
    /// Why the features model scored what it did: each feature's contribution (TreeSHAP or
    /// occlusion). Absent when it did not score the request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub features_model: Option<crate::features_model::Contributions>,
    /// The campaign and entity velocity the rules and guards read (`campaign.*`, `entity.*`);
    /// absent when `[campaign]` is off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub campaign: Option<crate::campaign::Velocity>,
}

/// One word's effect on the cpu model's risk score: `delta` = risk with the word minus risk
/// without it (positive: the word pushed towards risk).
#[derive(Debug, Clone, Serialize)]
pub struct Attribution {
    pub word: String,
    /// 0-based position among the words scored.
    pub index: usize,
    pub delta: f64,
}

/// Which policy decided a request in an A/B test (`[ab]`): the live one or the candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arm {
    Live,
    Candidate,
}

impl Arm {
    /// The metric label and the decision's `arm`.
    pub fn as_str(self) -> &'static str {
        match self {
            Arm::Live => "live",
            Arm::Candidate => "candidate",
        }
    }
}
