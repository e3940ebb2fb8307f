//! The routing sections of a policy file: `[actions]`, `[cascade]`, `[routing]`, `[cpu]`, `[gpu]`,
//! `[features_model]`, `[calibration]`.

use crate::action::Action;
use serde::Deserialize;

/// `[actions]`: map a calibrated risk score to an action.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ActionThresholds {
    /// `risk_score >= review_at` gives at least `review`.
    pub review_at: f64,
    /// `risk_score >= block_at` gives `block`.
    pub block_at: f64,
}

impl ActionThresholds {
    pub fn action_for(&self, risk_score: f64) -> Action {
        if risk_score >= self.block_at {
            Action::Block
        } else if risk_score >= self.review_at {
            Action::Review
        } else {
            Action::Allow
        }
    }
}

/// `[cascade]`: when a model verdict stands, escalates, or hands over to rules.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Cascade {
    /// A cpu verdict with calibrated confidence below this escalates to the gpu tier when it
    /// is eligible. Defaults to `accept_below` (no band where escalation is tried but the cpu
    /// verdict would still stand).
    #[serde(default)]
    pub escalate_below: Option<f64>,
    /// A final model verdict with calibrated confidence below this goes to rules.
    pub accept_below: f64,
    /// A model verdict of `risk` needs at least this calibrated confidence to stand (and to
    /// skip escalation): a blocking verdict must be precise on legitimate look-alikes, as a
    /// blocking guard must. Below it the verdict escalates or goes to rules (the bundled
    /// `model_leaning_risky` rule makes it a review). Defaults to `accept_below`; the higher of
    /// the two applies, so a value below `accept_below` has no effect.
    #[serde(default)]
    pub accept_risk_below: Option<f64>,
    /// A cpu verdict whose out-of-distribution score is above this is not trusted whatever its
    /// confidence: it escalates to the gpu tier when eligible, else goes to rules.
    pub ood_above: f64,
    /// Languages (ISO 639-3, as `text::Language::code`) the cpu model was measured to read: a
    /// text reliably detected in another language, in any of its windows, never gets a cpu
    /// verdict; it goes on like out-of-distribution text. Romanised Hindi is `hin` in the `Latn`
    /// script.
    #[serde(default = "english")]
    pub model_languages: Vec<String>,
    /// Scripts (ISO 15924: "Latn", "Hani", "Cyrl", "Arab", "Deva", "Hira", "Kana", ...) the cpu
    /// model was measured to read. A text whose main script, or a passage of another script in it
    /// (code-mixed chat), is outside this list never gets a cpu verdict, whatever its language
    /// guess (short texts have no reliable language, but their script is always known).
    #[serde(default = "latin")]
    pub model_scripts: Vec<String>,
    /// Languages the detector confuses with a served one, each read as that one (ISO 639-3,
    /// guess -> served): whatlang's trigram profiles read informal Indonesian chat as Javanese,
    /// short Russian as Bulgarian, Hindi as Marathi or Nepali (measured on the team's check sets;
    /// `models/MODEL_CARD.md`). Without an entry such a text never gets a cpu verdict; with one,
    /// a text truly in the neighbour language is read by the model as the served one. Empty by
    /// default; each value must be in `model_languages`.
    #[serde(default)]
    pub language_neighbours: std::collections::BTreeMap<String, String>,
    /// A cpu verdict of `risk` too unsure to stand (below `accept_risk_below`) but with
    /// `risk_score` at or above this gets a second opinion from the confirm model (`[confirm]`
    /// in the server config: a larger classifier on the CPU) before it goes to the rules: where
    /// that model's calibrated risk reaches `confirm_at`, the cpu verdict stands. Only where the
    /// verdict would go to the rules (a gpu tier that is eligible decides instead). Unset, or no
    /// confirm model loaded: no second opinion.
    #[serde(default)]
    pub confirm_from: Option<f64>,
    /// The confirm model's calibrated risk that lets a cpu verdict in the `confirm_from` band
    /// stand (default 0.97).
    #[serde(default = "confirm_at")]
    pub confirm_at: f64,
}

fn confirm_at() -> f64 {
    0.97
}

fn english() -> Vec<String> {
    vec!["eng".into()]
}

fn latin() -> Vec<String> {
    vec!["Latn".into()]
}

impl Cascade {
    pub fn escalate_below(&self) -> f64 {
        self.escalate_below.unwrap_or(self.accept_below)
    }

    /// The confidence a final verdict needs to stand: `accept_risk_below` for a `risk` verdict
    /// (`risk_score > 0.5`), `accept_below` for an `ok` one.
    pub fn accept_below_for(&self, risk_score: f64) -> f64 {
        match self.accept_risk_below {
            Some(r) if risk_score > 0.5 => r.max(self.accept_below),
            _ => self.accept_below,
        }
    }

    /// Whether an unsure cpu verdict with this `risk_score` asks the confirm model: `risk_score`
    /// at or above `confirm_from` (never for an `ok` lean).
    pub fn confirms(&self, risk_score: f64) -> bool {
        self.confirm_from.is_some_and(|from| risk_score > 0.5 && risk_score >= from)
    }

    /// The confidence a cpu verdict needs to skip escalation: `escalate_below`, raised to
    /// [`Self::accept_below_for`] where that is higher (a verdict that could not stand escalates).
    pub fn escalate_below_for(&self, risk_score: f64) -> f64 {
        self.escalate_below().max(self.accept_below_for(risk_score))
    }
}

/// What to do when neither model tier can take a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WhenSaturated {
    /// Rules decide (the decision records why).
    Rules,
    /// Answer 503 with `Retry-After`.
    Shed,
}

/// How a signal that is unknown (never sampled, or older than its staleness limit) counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum UnknownSignal {
    /// As if within limits (fail open).
    Eligible,
    /// As if over limits (fail closed).
    Ineligible,
}

/// `[routing]`: which tier a request starts on.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Routing {
    /// Complexity above this starts on the gpu tier when it is eligible.
    pub cpu_max_complexity: f64,
    /// Escalation to the gpu tier needs at least this complexity (0: any request may escalate).
    pub gpu_min_complexity: f64,
    pub when_saturated: WhenSaturated,
    /// `Retry-After` seconds when shedding.
    pub retry_after_s: u64,
    pub unknown_signals: UnknownSignal,
}

impl Default for Routing {
    fn default() -> Self {
        Routing {
            cpu_max_complexity: 0.7,
            gpu_min_complexity: 0.0,
            when_saturated: WhenSaturated::Rules,
            retry_after_s: 1,
            unknown_signals: UnknownSignal::Eligible,
        }
    }
}

/// `[cpu]`: when the cpu tier is too loaded to take a request.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CpuLimits {
    /// Machine CPU utilisation (EWMA, [0, 1]) above which the cpu tier is not eligible.
    pub max_utilization: f64,
    /// Requests waiting for a cpu worker above which the cpu tier is not eligible.
    pub max_queue_depth: usize,
    /// Share of a request's remaining deadline, [0, 1], that its expected queue wait (queue
    /// depth x service time per job / workers) may take; above it the cpu tier is not eligible.
    /// A target sojourn time per request (as CoDel's target, scaled to each deadline): under
    /// overload the queue stays about this long for default-deadline traffic (0.25 of 200 ms:
    /// 50 ms), which keeps the model's answers well inside their deadline and leaves room for
    /// the estimate's error, and the excess goes to the next stage at once; a caller that allows
    /// a longer deadline may wait longer.
    pub max_queue_wait_share: f64,
}

impl Default for CpuLimits {
    fn default() -> Self {
        CpuLimits { max_utilization: 1.0, max_queue_depth: 128, max_queue_wait_share: 0.25 }
    }
}

/// `[gpu]`: when the gpu tier may take a request.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct GpuLimits {
    /// Free GPU memory (MiB) below which the gpu tier is not eligible (in-process backend).
    pub min_free_memory_mb: u64,
    /// Requests in flight on the gpu tier at or above which it admits no more (routes down).
    pub max_in_flight: usize,
    /// KV-cache headroom ([0, 1], upstream servers exposing metrics) below which the gpu tier is not eligible.
    pub min_kv_cache_headroom: f64,
    /// Hysteresis of `min_free_memory_mb`, MiB: once below the limit, the tier is eligible again
    /// only at `min_free_memory_mb + free_memory_hysteresis_mb`, so a reading that hovers
    /// around the limit does not flip routing at every sample.
    pub free_memory_hysteresis_mb: u64,
    /// Hysteresis of `min_kv_cache_headroom` ([0, 1]): eligible again only at
    /// `min_kv_cache_headroom + kv_cache_hysteresis` (a server reporting 0.93 / 0.97 usage in
    /// turn around a 0.95 limit would otherwise switch the tier at every scrape).
    pub kv_cache_hysteresis: f64,
}

impl Default for GpuLimits {
    fn default() -> Self {
        GpuLimits {
            min_free_memory_mb: 1024,
            max_in_flight: 16,
            min_kv_cache_headroom: 0.05,
            free_memory_hysteresis_mb: 1024,
            kv_cache_hysteresis: 0.05,
        }
    }
}

/// `[safety]`: how guard rules, the allow-list and rule failures act on a decision.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Safety {
    /// The least action of a decision in which a rule, guard or allow-list entry failed to
    /// evaluate (a type error, a feature of the wrong type): such a failure is never skipped in
    /// silence. `allow` restores the old behaviour (count and ignore).
    pub on_rule_error: Action,
    /// Whether a matching `[[allowlist]]` entry may lower an action that a guard raised (it may
    /// always lower the cascade's own action).
    pub allowlist_overrides_guards: bool,
}

impl Default for Safety {
    fn default() -> Self {
        Safety { on_rule_error: Action::Review, allowlist_overrides_guards: false }
    }
}

/// `[features_model]`: how the features model's calibrated risk (when the server has a features
/// model and the request carries its features) combines with the text's verdict.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct FeaturesModelPolicy {
    /// `max` (default): the decision's action is the higher of the text's and the features
    /// model's own (its risk against `review_at`/`block_at`); `variable`: its risk is only the
    /// rule and guard variable `features_model.risk`.
    pub combine: Combine,
    /// The features model's risk at or above which it asks for at least `review`.
    pub review_at: f64,
    /// The features model's risk at or above which it asks for `block`.
    pub block_at: f64,
}

/// How a second model's verdict combines with the text's ([`FeaturesModelPolicy::combine`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Combine {
    Max,
    Variable,
}

impl Default for FeaturesModelPolicy {
    fn default() -> Self {
        FeaturesModelPolicy { combine: Combine::Max, review_at: 0.5, block_at: 0.9 }
    }
}

impl FeaturesModelPolicy {
    /// The action the features model asks for at calibrated risk `risk` (pure).
    pub fn action_for(&self, risk: f64) -> Action {
        ActionThresholds { review_at: self.review_at, block_at: self.block_at }.action_for(risk)
    }
}

/// `[calibration]`: the policy's own reading of the cpu model's logits. The model's temperature
/// (`calibration.json` in the model directory) is fixed with the model; one set here travels with
/// the policy, so a re-fitted temperature (`tiergate tune`) is tried like any other policy change:
/// in `[shadow]`, as the `[ab]` candidate, by a reload, and rolled back with it.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Calibration {
    /// The cpu tier's temperature `T` (temperature scaling: `risk = softmax(logits / T)[1]`), in
    /// place of the served model's own. Unset: the model's. A finite number > 0; above 1 softens
    /// the scores towards 0.5, below 1 sharpens them. Scenario thresholds read the scores it gives.
    pub cpu_temperature: Option<f64>,
}

impl Calibration {
    /// The temperature the cpu tier's verdicts are read at under this policy, for a model served
    /// at `model` (its `calibration.json`).
    pub fn cpu_temperature_or(&self, model: f64) -> f64 {
        self.cpu_temperature.unwrap_or(model)
    }
}
