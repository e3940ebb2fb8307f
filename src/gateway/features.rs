//! The features model in a request: the request's `features` scored before the cascade (a 422
//! for features its schema cannot read), its risk combined with the cascade's decision after
//! it (`[features_model]` of the policy), one step of the path either way, and its
//! contributions in `explain`.

use super::Gateway;
use crate::action::Action;
use crate::decision::{Decision, Label, Outcome, Step, TierName};
use crate::error::ApiError;
use crate::features_model::{Contributions, FeatureError, Scored};
use crate::policy::{Combine, FeaturesModelPolicy};
use crate::request::ClassifyRequest;

impl Gateway {
    /// Scores `req`'s features when there is a features model and the request carries any of
    /// its schema's features (`Ok(None)` otherwise). Errors (422, `InvalidField`): required
    /// features missing (`field` = `features`, every one named), or a value the schema cannot
    /// read (`field` = `features.NAME`). A model failure is not an error here: it is the
    /// score's `Err`, which the combination fails closed on.
    pub(super) fn score_features(&self, req: &ClassifyRequest) -> Result<Option<Scored>, ApiError> {
        let Some(model) = &self.features_model else { return Ok(None) };
        if !model.schema.applies(&req.features) {
            return Ok(None);
        }
        let row = model.schema.vector(&req.features).map_err(|e| match e {
            FeatureError::Missing(names) => ApiError::InvalidField {
                field: "features".into(),
                message: format!(
                    "the features model `{}` needs {}; missing: {} (required by its schema)",
                    model.manifest.name,
                    model
                        .schema
                        .features
                        .iter()
                        .filter(|f| f.required)
                        .map(|f| f.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    names.join(", ")
                ),
            },
            FeatureError::Invalid { name, message } => {
                ApiError::InvalidField { field: format!("features.{name}"), message }
            }
        })?;
        let (at, started) = (std::time::SystemTime::now(), std::time::Instant::now());
        let score = model.score(&row).map_err(|e| format!("{e:#}"));
        if let Err(error) = &score {
            tracing::warn!(%error, "the features model failed; the decision is at least review");
        }
        Ok(Some(Scored { row, score, at, latency_us: started.elapsed().as_micros() as u64 }))
    }

    /// `explain`'s contributions for a scored request (`None` when it failed).
    pub(super) fn features_contributions(&self, scored: &Scored) -> Option<Contributions> {
        let (model, score) = (self.features_model.as_ref()?, scored.score.as_ref().ok()?);
        model.contributions(&scored.row, *score).map_err(|e| tracing::warn!(error = %e, "features contributions")).ok()
    }
}

/// Combines the features model's verdict with the cascade's decision `d` under `policy`, and
/// records it as a `features` step (pure). `combine = "max"`: the higher action stands (the
/// features model deciding when it is the higher); `variable`: the decision is unchanged. A
/// failed score (never a number that passes) raises the decision to at least `review`.
pub(super) fn combine(d: &mut Decision, scored: &Scored, policy: &FeaturesModelPolicy) {
    let mut step = Step::new(TierName::Features, Outcome::Accepted, scored.latency_us);
    let (asks, risk) = match &scored.score {
        Err(e) => {
            step.outcome = Outcome::Error;
            step.reason = Some(format!("{e}; a features score that is not a number never passes"));
            (Action::Review, None)
        }
        Ok(s) => {
            step.risk_score = Some(s.risk);
            step.confidence = Some(s.risk.max(1.0 - s.risk));
            (policy.action_for(s.risk), Some(s.risk))
        }
    };
    let text = d.action;
    let raises = asks > text && (policy.combine == Combine::Max || risk.is_none());
    if step.reason.is_none() {
        let risk = risk.unwrap_or_default();
        step.reason = Some(match policy.combine {
            Combine::Variable => format!("risk {risk:.3}: a rule variable only (combine = \"variable\")"),
            Combine::Max if raises => {
                format!(
                    "risk {risk:.3} asks for {}, above the text's {}: the higher stands",
                    asks.as_str(),
                    text.as_str()
                )
            }
            Combine::Max => format!("risk {risk:.3} asks for {}; the text's {} stands", asks.as_str(), text.as_str()),
        });
    }
    if raises {
        d.action = asks;
        d.tier = TierName::Features;
        d.rule = None;
        if let Some(risk) = risk {
            d.risk_score = d.risk_score.max(risk);
            d.label = Label::from_risk_score(d.risk_score);
            d.confidence = step.confidence;
        }
    }
    d.path.push(step);
}
