//! The campaign store's Prometheus metrics (names with the registry's `tiergate` prefix), and
//! the top campaigns by distinct sources in the last hour as a gauge per *rank*: the labels stay
//! `1..=top_k` whatever campaigns come and go, never one series per campaign id.

use super::Counts;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Which store answered a lookup: `redis` (shared by the fleet) or `local` (this replica alone:
/// no Redis configured, or Redis out of reach).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreLabels {
    pub store: &'static str,
}

/// A rank in the top campaigns, `"1"` (most distinct sources in the last hour) to `top_k`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RankLabels {
    pub rank: String,
}

/// Handles to the metrics; clones share the same values.
#[derive(Clone, Debug)]
pub struct CampaignMetrics {
    /// `tiergate_campaign_lookups_total{store}`.
    pub lookups: Family<StoreLabels, Counter>,
    /// `tiergate_campaign_lookup_seconds`: one lookup (signature, entities, store), seconds.
    pub lookup_seconds: Histogram,
    /// `tiergate_campaign_top_sources_1h{rank}`: distinct sources in the last hour of the
    /// campaign at that rank (as last seen by this replica; refreshed at most once a second).
    pub top_sources_1h: Family<RankLabels, Gauge>,
    /// `tiergate_campaign_top_count_1h{rank}`: requests in the last hour of the same campaign.
    pub top_count_1h: Family<RankLabels, Gauge>,
}

impl CampaignMetrics {
    /// Registers the metrics, every series created at zero (also when campaigns are off:
    /// dashboards find them): both stores, ranks `1..=top_k`.
    pub fn register(registry: &mut Registry, top_k: usize) -> CampaignMetrics {
        let metrics = CampaignMetrics {
            lookups: Family::default(),
            lookup_seconds: Histogram::new(exponential_buckets(5e-6, 2.0, 16)),
            top_sources_1h: Family::default(),
            top_count_1h: Family::default(),
        };
        for store in ["redis", "local"] {
            metrics.lookups.get_or_create(&StoreLabels { store }).inc_by(0);
        }
        for rank in 1..=top_k {
            metrics.top_sources_1h.get_or_create(&RankLabels { rank: rank.to_string() }).set(0);
            metrics.top_count_1h.get_or_create(&RankLabels { rank: rank.to_string() }).set(0);
        }
        let r = registry;
        r.register("campaign_lookups", "Campaign lookups, by the store that answered", metrics.lookups.clone());
        r.register("campaign_lookup_seconds", "One campaign lookup, seconds", metrics.lookup_seconds.clone());
        r.register(
            "campaign_top_sources_1h",
            "Distinct sources in the last hour of the campaign at each rank",
            metrics.top_sources_1h.clone(),
        );
        r.register(
            "campaign_top_count_1h",
            "Requests in the last hour of the campaign at each rank",
            metrics.top_count_1h.clone(),
        );
        metrics
    }
}

/// The campaigns with the most distinct sources in the last hour that this replica has seen.
pub struct TopCampaigns {
    k: usize,
    /// (campaign id, its counts, when last seen), at most `4 × k`.
    held: Mutex<(Vec<(String, Counts, Instant)>, Instant)>,
}

/// How often the gauges are rewritten, at most.
const REFRESH: Duration = Duration::from_secs(1);
/// A campaign not seen for this long leaves the top (its hour has mostly passed).
const STALE: Duration = Duration::from_secs(3600);

impl TopCampaigns {
    pub fn new(k: usize) -> TopCampaigns {
        TopCampaigns { k, held: Mutex::new((Vec::new(), Instant::now())) }
    }

    /// Notes a lookup's campaign counts; rewrites the gauges when [`REFRESH`] has passed.
    pub fn observe(&self, id: &str, counts: Counts, metrics: &CampaignMetrics) {
        let now = Instant::now();
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let (list, refreshed) = &mut *held;
        match list.iter().position(|(held, _, _)| held == id) {
            Some(i) => (list[i].1, list[i].2) = (counts, now),
            None if list.len() < 4 * self.k => list.push((id.to_string(), counts, now)),
            None => {
                let least = (0..list.len()).min_by_key(|i| list[*i].1.sources_1h).unwrap_or(0);
                if list[least].1.sources_1h < counts.sources_1h {
                    list[least] = (id.to_string(), counts, now);
                }
            }
        }
        if now.duration_since(*refreshed) < REFRESH {
            return;
        }
        *refreshed = now;
        list.retain(|(_, _, seen)| now.duration_since(*seen) < STALE);
        list.sort_by(|a, b| b.1.sources_1h.cmp(&a.1.sources_1h).then(b.1.count_1h.cmp(&a.1.count_1h)));
        for rank in 0..self.k {
            let labels = RankLabels { rank: (rank + 1).to_string() };
            let (sources, count) = list.get(rank).map_or((0, 0), |(_, c, _)| (c.sources_1h, c.count_1h));
            metrics.top_sources_1h.get_or_create(&labels).set(sources as i64);
            metrics.top_count_1h.get_or_create(&labels).set(count as i64);
        }
    }
}
