//! What `tiergate report` reads besides the store, from the flags and the config: where the
//! store is, the policy whose thresholds are marked, the tenants' classes, the drift reference,
//! and how to read the cpu scores of a policy with its own temperature against that reference.

use super::model::Thresholds;
use super::read::Decided;
use super::Args;
use anyhow::Context as _;
use std::path::{Path, PathBuf};
use tiergate::config::Config;
use tiergate::drift::Reference;
use tiergate::policy::Policy;
use tiergate::tenant::Tenants;

/// What the command reads besides the store.
pub struct Inputs {
    pub store: PathBuf,
    pub thresholds: Option<Thresholds>,
    pub tenants: Option<Tenants>,
    pub reference: Option<(PathBuf, Reference)>,
    /// Set when the policy reads the cpu model at its own temperature.
    pub rescore: Option<Rescore>,
}

/// The cpu risk scores of one policy version's decisions read back at the served model's own
/// temperature before they are compared with the drift reference (scored at it): a policy's
/// `[calibration] cpu_temperature` moves the scores on purpose, not the traffic — as the live
/// drift monitor reads them. Other versions' scores are compared as recorded.
#[derive(Debug, Clone, serde::Serialize, PartialEq)]
pub struct Rescore {
    pub policy_version: String,
    /// The policy's `[calibration] cpu_temperature`.
    pub policy_temperature: f64,
    /// The served model's (its `calibration.json`).
    pub model_temperature: f64,
}

impl Rescore {
    /// `d`'s risk score as the reference's model gives it, when `d` is a cpu decision of the
    /// policy version.
    pub fn apply(&self, d: &mut Decided) {
        if d.tier != "cpu" || d.policy_version.as_deref() != Some(self.policy_version.as_str()) {
            return;
        }
        if let Some(o) = d.observation.as_mut() {
            o.risk_score = tiergate::calibrate::retemper(o.risk_score, self.policy_temperature, self.model_temperature);
        }
    }
}

/// Reads the config (`--config`, else config/tiergate.toml when present) and what it names,
/// each overridden by its flag. Errors: no store named, or an unreadable config, policy or
/// reference (naming the file).
pub fn read(args: &Args) -> anyhow::Result<Inputs> {
    let config_path = args
        .config
        .clone()
        .or_else(|| Path::new(crate::DEFAULT_CONFIG).is_file().then(|| PathBuf::from(crate::DEFAULT_CONFIG)));
    let config: Option<Config> = config_path.map(|p| crate::load_config(Some(p))).transpose()?;
    let store = match (&args.audit_dir, config.as_ref().and_then(|c| c.audit.as_ref())) {
        (Some(dir), _) => dir.clone(),
        (None, Some(audit)) => audit.dir.clone(),
        (None, None) => anyhow::bail!("give --audit-dir (the `[audit] dir`) or a --config with an [audit] section"),
    };
    let policy_dir = args.policy_dir.clone().or_else(|| config.as_ref().map(|c| c.policies.dir.clone()));
    let policy = policy_dir.as_deref().map(load_policy).transpose()?;
    let thresholds = policy.as_ref().zip(policy_dir.as_deref()).map(|(p, dir)| thresholds(p, dir));
    // As live quality classes them: a known tenant's class, else the default class.
    let tenants = config.as_ref().map(|c| Tenants::new(&c.tenants, None));
    let reference_path = args.reference.clone().or_else(|| {
        let c = config.as_ref()?;
        Some(c.drift.reference.clone().unwrap_or_else(|| c.model.dir.join("reference.json"))).filter(|p| p.is_file())
    });
    let reference = reference_path.map(|p| Reference::load(&p).map(|r| (p, r))).transpose()?;
    let model_dir = config.as_ref().map_or_else(|| PathBuf::from("models"), |c| c.model.dir.clone());
    let rescore = match (&policy, &reference) {
        (Some(p), Some(_)) => rescore(p, &model_dir),
        _ => None,
    };
    Ok(Inputs { store, thresholds, tenants, reference, rescore })
}

fn load_policy(dir: &Path) -> anyhow::Result<Policy> {
    Policy::load_dir(dir)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("reading the policy {} for its thresholds", dir.display()))
}

fn thresholds(policy: &Policy, dir: &Path) -> Thresholds {
    Thresholds {
        dir: dir.display().to_string(),
        version: policy.version.clone(),
        review_at: policy.actions.review_at,
        block_at: policy.actions.block_at,
        scenarios: policy
            .scenarios
            .iter()
            .map(|(n, s)| (n.clone(), (s.actions.review_at, s.actions.block_at)))
            .collect(),
    }
}

/// `None` when the policy keeps the model's temperature; also when the model's cannot be read
/// (said on stderr: the drift plot then compares that policy's cpu scores as recorded).
fn rescore(policy: &Policy, model_dir: &Path) -> Option<Rescore> {
    let policy_temperature = policy.calibration.cpu_temperature?;
    match crate::cli::tune::model_temperature(model_dir) {
        Ok(model_temperature) => {
            Some(Rescore { policy_version: policy.version.clone(), policy_temperature, model_temperature })
        }
        Err(e) => {
            eprintln!(
                "report: {e:#}; policy {}'s cpu scores are compared with the reference as recorded",
                policy.version
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiergate::drift::Observation;

    fn decided(tier: &str, version: &str, risk_score: f64) -> Decided {
        Decided {
            unix_ms: 0,
            kind: "classify".into(),
            action: "allow".into(),
            tier: tier.into(),
            policy_version: Some(version.into()),
            record_id: None,
            observation: Some(Observation { risk_score, ood_score: None, text_chars: 1, lang: None }),
        }
    }

    #[test]
    fn only_the_policy_versions_cpu_scores_are_read_back_at_the_model_temperature() {
        let r = Rescore { policy_version: "tuned".into(), policy_temperature: 2.0, model_temperature: 1.0 };
        let score = |mut d: Decided| {
            r.apply(&mut d);
            d.observation.unwrap().risk_score
        };
        // At T = 2 a margin of 2 reads sigmoid(1); at the model's T = 1, sigmoid(2).
        let sigmoid = |z: f64| 1.0 / (1.0 + (-z).exp());
        assert!((score(decided("cpu", "tuned", sigmoid(1.0))) - sigmoid(2.0)).abs() < 1e-12);
        assert_eq!(score(decided("cpu", "live", 0.7)), 0.7, "another version: as recorded");
        assert_eq!(score(decided("rules", "tuned", 0.7)), 0.7, "a rule's score is declared");
    }
}
