//! [`LocalQuotas`]: rate and daily-budget state in this process. Rates are GCRA (crate
//! `governor`), one keyed limiter per distinct quota; budgets are counters per key and UTC day.
//!
//! Keys are bounded by config (one per known tenant plus one shared by every unknown tenant),
//! so neither map needs sweeping.

use super::quota::{Denied, Limit, Quota, QuotaStore};
use futures_util::future::{self, BoxFuture};
use governor::clock::{Clock, DefaultClock};
use governor::DefaultKeyedRateLimiter;
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const DAY_S: u64 = 24 * 60 * 60;

/// Quotas kept in this process: each replica counts alone (N replicas allow N times the rate).
#[derive(Default)]
pub struct LocalQuotas {
    limiters: RwLock<HashMap<Quota, Arc<DefaultKeyedRateLimiter<String>>>>,
    /// key -> (UTC day number, calls taken that day).
    daily: Mutex<HashMap<String, (u64, u32)>>,
}

impl LocalQuotas {
    pub fn new() -> LocalQuotas {
        LocalQuotas::default()
    }

    /// The keyed GCRA limiter for `quota` (made on first use; quotas come from config, so few).
    fn limiter(&self, quota: Quota) -> Arc<DefaultKeyedRateLimiter<String>> {
        if let Some(l) = self.limiters.read().unwrap_or_else(|e| e.into_inner()).get(&quota) {
            return Arc::clone(l);
        }
        let mut all = self.limiters.write().unwrap_or_else(|e| e.into_inner());
        let limiter = all.entry(quota).or_insert_with(|| {
            let rate = NonZeroU32::new(quota.per_second).unwrap_or(NonZeroU32::MIN);
            let burst = NonZeroU32::new(quota.burst).unwrap_or(NonZeroU32::MIN);
            Arc::new(governor::RateLimiter::keyed(governor::Quota::per_second(rate).allow_burst(burst)))
        });
        Arc::clone(limiter)
    }

    /// [`QuotaStore::check_rate`] without the future: GCRA over `key`'s cell for `quota`.
    pub fn check_rate_now(&self, key: &str, quota: Quota) -> Result<(), Denied> {
        let limiter = self.limiter(quota);
        limiter.check_key(&key.to_string()).map_err(|not_until| Denied {
            limit: Limit::Rate,
            retry_after: not_until.wait_time_from(DefaultClock::default().now()),
        })
    }

    /// [`QuotaStore::take_daily`] without the future, as of `now` (since the Unix epoch).
    pub fn take_daily_at(&self, key: &str, per_day: u32, now: Duration) -> Result<(), Denied> {
        let day = now.as_secs() / DAY_S;
        let mut all = self.daily.lock().unwrap_or_else(|e| e.into_inner());
        let entry = all.entry(key.to_string()).or_insert((day, 0));
        if entry.0 != day {
            *entry = (day, 0);
        }
        if entry.1 >= per_day {
            let midnight = Duration::from_secs((day + 1) * DAY_S);
            return Err(Denied { limit: Limit::GpuDailyBudget, retry_after: midnight.saturating_sub(now) });
        }
        entry.1 += 1;
        Ok(())
    }
}

impl QuotaStore for LocalQuotas {
    fn check_rate<'a>(&'a self, key: &'a str, quota: Quota) -> BoxFuture<'a, Result<(), Denied>> {
        Box::pin(future::ready(self.check_rate_now(key, quota)))
    }

    fn take_daily<'a>(&'a self, key: &'a str, per_day: u32) -> BoxFuture<'a, Result<(), Denied>> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        Box::pin(future::ready(self.take_daily_at(key, per_day, now)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gcra_allows_the_burst_then_refuses_with_a_wait() {
        let q = LocalQuotas::new();
        let quota = Quota { per_second: 1, burst: 3 };
        for _ in 0..3 {
            q.check_rate_now("tenant:a", quota).unwrap();
        }
        let denied = q.check_rate_now("tenant:a", quota).unwrap_err();
        assert_eq!(denied.limit, Limit::Rate);
        assert!(denied.retry_after > Duration::ZERO && denied.retry_after <= Duration::from_secs(1), "{denied:?}");
        q.check_rate_now("tenant:b", quota).expect("another key has its own cell");
    }

    #[test]
    fn the_daily_budget_renews_at_utc_midnight() {
        let q = LocalQuotas::new();
        let late = Duration::from_secs(10 * DAY_S + DAY_S - 60);
        q.take_daily_at("k", 2, late).unwrap();
        q.take_daily_at("k", 2, late).unwrap();
        let denied = q.take_daily_at("k", 2, late).unwrap_err();
        assert_eq!(denied, Denied { limit: Limit::GpuDailyBudget, retry_after: Duration::from_secs(60) });
        q.take_daily_at("k", 2, late + Duration::from_secs(61)).expect("a new day");
    }

    #[tokio::test]
    async fn the_store_interface_answers_like_the_direct_calls() {
        let q: Arc<dyn QuotaStore> = Arc::new(LocalQuotas::new());
        let quota = Quota { per_second: 1, burst: 1 };
        q.check_rate("k", quota).await.unwrap();
        assert_eq!(q.check_rate("k", quota).await.unwrap_err().limit, Limit::Rate);
        q.take_daily("k", 1).await.unwrap();
        assert_eq!(q.take_daily("k", 1).await.unwrap_err().limit, Limit::GpuDailyBudget);
    }
}
