//! A candidate policy decided beside the live one (`[shadow]` in config), from the tier verdicts
//! the live run obtained, so shadowing never calls a model and never changes an answer.
//! Disagreements are counted by kind, logged with both decisions, and audited (kind `shadow`:
//! the candidate's decision).

use super::cascade::{self, Inputs, Recorded, Tiers};
use super::{Gateway, ShadowConfig};
use crate::audit::record::Event;
use crate::audit::Kind;
use crate::decision::Decision;
use crate::metrics::KindLabels;
use crate::policy::{Limits, Policy, PolicyStore};
use crate::request::ClassifyRequest;
use crate::select::LoadSnapshot;
use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;

pub struct Shadow {
    pub policies: PolicyStore,
    /// Share of requests evaluated, [0, 1].
    pub share: f64,
    log: Option<Log>,
}

/// Most lines waiting for the shadow log writer.
const LOG_QUEUE_LINES: usize = 4096;

/// The shadow log (`[shadow] log`): one writer task appending JSON lines, fed through a queue of
/// at most [`LOG_QUEUE_LINES`]; a slow disk drops lines (counted in `dropped`), it never holds
/// up a request or grows memory. Shared by the shadow policy and the shadow model.
#[derive(Clone)]
pub struct Log {
    tx: tokio::sync::mpsc::Sender<String>,
    dropped: Counter,
}

impl Log {
    /// Opens (creates, appends to) `path` and starts the writer (in a tokio runtime). A line the
    /// disk refuses is logged and counted in `dropped`, like one the queue had no room for.
    ///
    /// Errors: the file cannot be opened for appending (a missing directory, no permission).
    pub(super) fn open(path: &std::path::Path, dropped: Counter) -> anyhow::Result<Log> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| anyhow::anyhow!("shadow log {}: {e}", path.display()))?;
        let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(LOG_QUEUE_LINES);
        let (path, lost) = (path.to_path_buf(), dropped.clone());
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let mut file = tokio::fs::File::from_std(file);
            while let Some(line) = rx.recv().await {
                if let Err(e) = file.write_all(format!("{line}\n").as_bytes()).await {
                    lost.inc();
                    tracing::error!(path = %path.display(), error = %e, "writing the shadow log: line dropped");
                }
            }
        });
        Ok(Log { tx, dropped })
    }

    /// Queues a line, or drops and counts it when the queue is full.
    pub(super) fn send(&self, line: String) {
        enqueue(&self.tx, line, &self.dropped);
    }
}

impl Shadow {
    /// Loads the candidate policy (within the server's `limits`, as the live one); `None` when
    /// `[shadow] dir` is unset.
    pub(super) fn start(config: &ShadowConfig, limits: Limits, log: Option<Log>) -> anyhow::Result<Option<Shadow>> {
        let Some(dir) = &config.dir else { return Ok(None) };
        let policy = Policy::load_dir_within(dir, &limits).map_err(|e| anyhow::anyhow!("shadow policy: {e}"))?;
        tracing::info!(version = %policy.version, share = config.share, "shadow policy loaded");
        let policies = PolicyStore::within(policy, limits);
        Ok(Some(Shadow { policies, share: config.share, log }))
    }

    /// Whether this request is one of the shadowed share.
    pub(super) fn sampled(&self) -> bool {
        fastrand::f64() < self.share
    }

    /// The candidate's decision on the same request, from the live run's tier verdicts (a tier
    /// the live run did not call counts as unavailable).
    pub(super) async fn decide(
        &self,
        g: &Gateway,
        req: &ClassifyRequest,
        snapshot: &LoadSnapshot,
        recorded: &Recorded,
        live: &Decision,
    ) -> Option<Decision> {
        let policy = self.policies.snapshot();
        // A candidate without the request's scenario has no decision to compare.
        let scenario = policy.scenario(req.scenario.as_deref()).ok()?;
        let inputs = Inputs {
            policy: &policy,
            scenario,
            req,
            snapshot,
            started: Instant::now(),
            features: recorded.features.as_ref(),
        };
        let (mut candidate, _) = cascade::run(
            &inputs,
            g.assess(&policy, policy.rules.read(&req.text), req, snapshot),
            &Tiers::Replay(recorded),
        )
        .await
        .ok()?;
        candidate.request_id = live.request_id.clone();
        candidate.policy_version = policy.version.clone();
        candidate.scenario = scenario.map(|s| s.name.clone());
        candidate.model = g.model_name(&candidate);
        candidate.latency_us = inputs.started.elapsed().as_micros() as u64;
        candidate.subject = live.subject.clone();
        g.metrics.shadow_evaluations.inc();
        let kinds: Vec<&'static str> = [
            ("label", live.label != candidate.label),
            ("action", live.action != candidate.action),
            ("tier", live.tier != candidate.tier),
        ]
        .into_iter()
        .filter_map(|(kind, differs)| differs.then_some(kind))
        .collect();
        for kind in &kinds {
            g.metrics.shadow_disagreements.get_or_create(&KindLabels { kind }).inc();
        }
        if !kinds.is_empty() {
            g.record_detached(Event::Decided { kind: Kind::Shadow, decision: &candidate });
        }
        if let (false, Some(log)) = (kinds.is_empty(), &self.log) {
            let line = serde_json::json!({
                "request_id": live.request_id,
                "disagree": kinds,
                "live": {"policy_version": live.policy_version, "label": live.label, "action": live.action,
                         "tier": live.tier, "rule": live.rule, "risk_score": live.risk_score},
                "candidate": {"policy_version": candidate.policy_version, "label": candidate.label, "action": candidate.action,
                              "tier": candidate.tier, "rule": candidate.rule, "risk_score": candidate.risk_score,
                              "path": candidate.path},
            });
            log.send(line.to_string());
        }
        Some(candidate)
    }
}

/// Queues a line for the log writer, or drops and counts it when [`LOG_QUEUE_LINES`] are
/// already waiting (a slow disk never holds up a request or grows memory).
fn enqueue(log: &tokio::sync::mpsc::Sender<String>, line: String, dropped: &Counter) {
    if log.try_send(line).is_err() {
        dropped.inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_log_queue_drops_and_counts_instead_of_growing() {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(LOG_QUEUE_LINES);
        let dropped = Counter::default();
        for i in 0..LOG_QUEUE_LINES + 10 {
            enqueue(&tx, format!("line {i}"), &dropped);
        }
        assert_eq!(dropped.get(), 10, "the writer is stalled: lines past the queue are dropped, counted");
        assert_eq!(rx.try_recv().unwrap(), "line 0", "the queued lines are the oldest, in order");
        enqueue(&tx, "after".into(), &dropped);
        assert_eq!(dropped.get(), 10, "room again once the writer takes a line");
    }
}
