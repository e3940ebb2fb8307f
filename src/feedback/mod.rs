//! Feedback: what analysts, chargebacks and user reports say a decision should have been, joined
//! to the decision's audit record and counted into live quality (issue 29's loop: label →
//! report → tune → A/B → promote; runbook in docs/operations.md "Feedback loop").
//!
//! A label names its record by the record's own id (`record_id`, a UUIDv7 unique across
//! replicas and restarts, in every decision response) or by the client's `request_id` (which can
//! repeat: the newest decision with it is taken). It is written by the audit trail's single
//! writer into the `feedback` table beside the record ([`store`]), lives as long as the record,
//! and ships to Kafka keyed like the record. One label counts per (record, source): a repeat is
//! a `duplicate`, a changed label an `update`.

pub mod config;
pub mod forward;
pub mod input;
pub mod live;
pub mod quality;
pub mod store;

pub use config::FeedbackConfig;
pub use input::{parse_labels, Label, Target, MAX_BATCH};

use crate::tenant::Tenants;
use quality::{QualityMetrics, Refresher};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::Notify;

/// What a decision should have been: the ground truth a label gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Truth {
    Risk,
    Ok,
}

impl Truth {
    /// The stored and shipped spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Truth::Risk => "risk",
            Truth::Ok => "ok",
        }
    }

    pub fn parse(s: &str) -> Option<Truth> {
        match s {
            "risk" => Some(Truth::Risk),
            "ok" => Some(Truth::Ok),
            _ => None,
        }
    }
}

/// What became of one label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The first label of this source for the record.
    Accepted,
    /// The same label from the same source again: nothing changed (idempotent).
    Duplicate,
    /// The source changed its label: the new one replaced the old.
    Updated,
    /// No decision record with that id here (never made, expired, another tenant's, or a
    /// shadow record).
    Unknown,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Duplicate => "duplicate",
            Outcome::Updated => "updated",
            Outcome::Unknown => "unknown",
        }
    }
}

/// One label's result, as `POST /v1/feedback` answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// The labelled record's id; for `unknown`, the id the label gave.
    pub record_id: Option<String>,
    /// The request id the label gave, or the labelled record's.
    pub request_id: Option<String>,
    pub outcome: Outcome,
    /// The replica that held the record, when the label was forwarded to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
}

/// The feedback side of a running server: the fleet's peers and live quality.
pub struct Feedback {
    pub peers: forward::Peers,
    pub metrics: QualityMetrics,
    /// Live quality's latest numbers (the gauges' values as one snapshot).
    latest: Arc<live::Latest>,
    /// Wakes the quality refresher (labels arrived).
    refresh: Arc<Notify>,
}

/// Refreshes triggered by labels come at most this often.
const REFRESH_SPACING: Duration = Duration::from_secs(1);

impl Feedback {
    /// Starts live quality over the audit store `db` (a task on the current tokio runtime, which
    /// ends with the returned value) and the peers. `admin_token`: this replica's, presented to
    /// the peers. Errors: an invalid `config`.
    pub fn start(
        config: &FeedbackConfig,
        db: PathBuf,
        tenants: Arc<Tenants>,
        metrics: QualityMetrics,
        admin_token: Option<String>,
    ) -> anyhow::Result<Feedback> {
        config.validate().map_err(anyhow::Error::msg)?;
        let latest = Arc::new(live::Latest::default());
        let refresher = Arc::new(Refresher {
            db,
            windows: config.window_durations().map_err(anyhow::Error::msg)?,
            tenants,
            metrics: metrics.clone(),
            latest: Arc::clone(&latest),
        });
        let refresh = Arc::new(Notify::new());
        tokio::spawn(refresh_loop(
            refresher,
            Arc::downgrade(&refresh),
            Duration::from_millis(config.refresh_interval_ms),
        ));
        let peers = forward::Peers::new(&config.peers, admin_token, Duration::from_millis(config.forward_timeout_ms));
        Ok(Feedback { peers, metrics, latest, refresh })
    }

    /// Live quality as of its last refresh (`None` before the first: `refresh_interval_ms`
    /// after start, or soon after the first labels).
    pub fn live(&self) -> Option<live::Snapshot> {
        self.latest.get()
    }

    /// Counts `applied` (of `labels`) and, when any changed the store, asks for a refresh of live
    /// quality. Each label counts once across a fleet: where its record is (a peer's find is
    /// counted by the peer, not again by the replica that forwarded it), and an `unknown` only
    /// by the replica the client sent it to (`forwarded`: this request came from a peer).
    pub fn counted(&self, labels: &[Label], applied: &[Applied], forwarded: bool) {
        for (label, a) in labels.iter().zip(applied) {
            let here = a.replica.is_none();
            if !here || (forwarded && a.outcome == Outcome::Unknown) {
                continue;
            }
            let key =
                quality::LabelOutcome { source: quality::source_label(&label.source), outcome: a.outcome.as_str() };
            self.metrics.labels.get_or_create(&key).inc();
        }
        if applied.iter().any(|a| matches!(a.outcome, Outcome::Accepted | Outcome::Updated)) {
            self.refresh.notify_one();
        }
    }
}

async fn refresh_loop(refresher: Arc<Refresher>, refresh: Weak<Notify>, every: Duration) {
    loop {
        let Some(notify) = refresh.upgrade() else { return };
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = notify.notified() => {}
        }
        drop(notify);
        let r = Arc::clone(&refresher);
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        match tokio::task::spawn_blocking(move || r.refresh(now)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %format!("{e:#}"), "live quality could not read the audit store"),
            Err(e) => tracing::warn!(error = %e, "live quality refresh failed"),
        }
        tokio::time::sleep(REFRESH_SPACING).await;
    }
}
