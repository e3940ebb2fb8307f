//! Each decision's audit record: the gateway knows the model behind a decision, so records are
//! drafted here and handed to the trail ([`crate::audit`]), whichever front door decided.

use super::Gateway;
use crate::audit::record::{now_ms, UNSCREENED};
use crate::audit::{Draft, Kind, ModelRef};
use crate::decision::{Decision, TierName};
use crate::error::ApiError;
use std::path::Path;
use std::sync::Arc;

impl Gateway {
    /// Queues the record of a decision of `kind` (`route`: the proxy route or layer that
    /// screened). Errors only under `[audit] on_full = "block"` when the queue is full: a 503
    /// (`ApiError::Shed`) for the caller to answer with instead of the decision.
    pub fn audit(&self, kind: Kind, route: Option<&str>, d: &Decision) -> Result<(), ApiError> {
        let Some(audit) = &self.audit else { return Ok(()) };
        audit.submit(Draft::decided(kind, route, self.model_ref(d), d))
    }

    /// Queues a record no response waits on (a shadow disagreement): see
    /// [`crate::audit::Audit::submit_detached`].
    pub(super) fn audit_detached(&self, kind: Kind, d: &Decision) {
        if let Some(audit) = &self.audit {
            audit.submit_detached(Draft::decided(kind, None, self.model_ref(d), d));
        }
    }

    /// Queues the record of a request that a fail-open route forwarded without a decision,
    /// because screening failed for `reason`: kind `screen`, action and tier `unscreened`.
    /// Errors as [`Gateway::audit`].
    pub fn audit_unscreened(
        &self,
        route: &str,
        request_id: &str,
        policy: Option<&Path>,
        reason: &str,
    ) -> Result<(), ApiError> {
        let Some(audit) = &self.audit else { return Ok(()) };
        audit.submit(Draft {
            request_id: request_id.to_string(),
            unix_ms: now_ms(),
            kind: Kind::Screen,
            tenant: None,
            route: Some(route.to_string()),
            policy_version: self.policy_store(policy).snapshot().version.clone(),
            scenario: None,
            model: self.cpu_model_ref(),
            action: UNSCREENED,
            label: None,
            risk_score: None,
            tier: UNSCREENED,
            path: Vec::new(),
            note: Some(serde_json::json!({"outcome": UNSCREENED, "reason": reason, "latency_us": 0})),
            latency_us: 0,
            lang: None,
            text: Arc::from(""),
        })
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
