//! Each decision's audit record: the gateway knows the model behind a decision, so records are
//! drafted here and handed to the trail ([`crate::audit`]), whichever front door decided.

use super::Gateway;
use crate::audit::record::Event;
use crate::audit::{Draft, ModelRef};
use crate::decision::{Decision, TierName};
use crate::error::ApiError;

impl Gateway {
    /// The record phase: queues the audit record of `event` (`route`: the proxy route or layer
    /// that screened; `None` for the classify endpoint), naming the model behind it, and returns
    /// the record's id (`None` without the trail). Errors only under `[audit] on_full = "block"`
    /// when the queue is full: a 503 (`ApiError::Shed`) for the caller to answer with instead of
    /// the decision.
    pub fn record(&self, event: Event<'_>, route: Option<&str>) -> Result<Option<String>, ApiError> {
        let Some(audit) = &self.audit else { return Ok(None) };
        let draft = self.draft(event, route);
        let record_id = draft.record_id.clone();
        audit.submit(draft)?;
        Ok(Some(record_id))
    }

    /// [`Gateway::record`] for a record no response waits on (a shadow disagreement): see
    /// [`crate::audit::Audit::submit_detached`].
    pub(super) fn record_detached(&self, event: Event<'_>) {
        if let Some(audit) = &self.audit {
            audit.submit_detached(self.draft(event, None));
        }
    }

    fn draft(&self, event: Event<'_>, route: Option<&str>) -> Draft {
        let model = match &event {
            Event::Decided { decision, .. } => self.model_ref(decision),
            Event::Unscreened { .. } | Event::StreamCut { .. } => self.cpu_model_ref(),
        };
        Draft::new(event, route, model)
    }

    /// The model a decision names, with the sha256 of its directory's manifest (`None` for a
    /// model server, whose files tiergate does not see).
    pub fn model_ref(&self, d: &Decision) -> ModelRef {
        let sha256 = match (d.tier, &self.gpu) {
            (TierName::Gpu, Some(g)) => g.model_info().map(|i| i.manifest_sha256.clone()),
            (TierName::Gpu, None) => None,
            _ => Some(self.cpu.info().manifest_sha256.clone()),
        };
        ModelRef { name: d.model.clone(), sha256 }
    }

    /// The cpu model, for records no model decided (stream cuts, unscreened requests): the model
    /// deployed beside the rules, as a rules decision names it.
    pub fn cpu_model_ref(&self) -> ModelRef {
        let info = self.cpu.info();
        ModelRef { name: info.name.clone(), sha256: Some(info.manifest_sha256.clone()) }
    }
}
