//! Cost the tenant limits add to one request with local state (`LocalQuotas`): resolving the
//! tenant (trusted header, or an API key's SHA-256), the GCRA rate check, the tenant's routing
//! signals and the gpu eligibility with its fair share and budget, and taking and giving back a
//! gpu slot with one call from the daily budget — against the gpu eligibility without tenant
//! limits (what a request paid before). The bound: ≤ 5 µs p50 added.
//!
//! Run: `cargo bench --bench tenant_limits -- --warm-up-time 1 --measurement-time 3`; the p50
//! is the `median` in `target/criterion/tenant/*/new/estimates.json`.

use criterion::{criterion_group, criterion_main, Criterion};
use futures_util::FutureExt;
use http::HeaderMap;
use std::hint::black_box;
use std::path::Path;
use std::time::Duration;
use tiergate::breaker::CircuitState;
use tiergate::gateway::tenant_load;
use tiergate::policy::Policy;
use tiergate::select::{gpu_eligibility, CpuLoad, GpuLoad, GpuMemory, KvCache, LoadSnapshot};
use tiergate::tenant::{fair_share_slots, LocalQuotas, QuotaStore, Tenants, TenantsConfig};

fn snapshot() -> LoadSnapshot {
    LoadSnapshot {
        confirm: false,
        tenant: Default::default(),
        cpu: CpuLoad {
            utilization: Some(0.4),
            queue_depth: 2,
            in_flight: 1,
            service_us: Some(6000),
            queue_wait_us: Some(6000),
        },
        gpu: GpuLoad {
            unavailable: None,
            memory: GpuMemory::FreeMb(40_000),
            utilization: Some(0.3),
            in_flight: 1,
            p95_us: Some(60_000),
            queue_wait_us: None,
            ewma_us: Some(50_000),
            circuit: CircuitState::Closed,
            kv_cache: KvCache::NotExposed,
            was_below: Default::default(),
            endpoints_available: None,
        },
    }
}

/// 50 known tenants (one with an API key), a class with a rate no bench run reaches, a gpu
/// share and a daily budget no bench run spends.
fn tenants() -> Tenants {
    let mut text = String::from("trusted_header = \"x-client-tenant\"\n[api_keys]\n");
    text.push_str("\"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\" = \"t7\"\n[known]\n");
    for i in 0..50 {
        text.push_str(&format!("t{i} = \"gold\"\n"));
    }
    text.push_str("[classes.gold]\nrate = { per_second = 4000000000, burst = 4000000000 }\ngpu_share = 0.5\n");
    text.push_str("gpu_daily_budget = 4000000000\n");
    let config: TenantsConfig = toml::from_str(&text).unwrap();
    config.check(None).unwrap();
    Tenants::new(&config, None)
}

fn bench(c: &mut Criterion) {
    let policy = Policy::load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap();
    let remaining = Duration::from_millis(200);
    let base = snapshot();
    c.bench_function("tenant/without", |b| b.iter(|| gpu_eligibility(&policy, black_box(&base), remaining)));

    let tenants = tenants();
    let quotas = LocalQuotas::new();
    let mut by_header = HeaderMap::new();
    by_header.insert("x-client-tenant", "t7".parse().unwrap());
    let mut by_key = HeaderMap::new();
    by_key.insert("x-api-key", "test".parse().unwrap());
    for (name, headers) in [("tenant/local_header", &by_header), ("tenant/local_api_key", &by_key)] {
        c.bench_function(name, |b| {
            b.iter(|| {
                // What a request pays: identify, admit, snapshot, eligibility, then (for the
                // requests that go to the gpu tier) a slot and a budget call.
                let id = tenants.resolve(black_box(headers), None, None).unwrap();
                let quota = id.state.class.rate.unwrap();
                quotas.check_rate(&id.state.key, quota).now_or_never().unwrap().unwrap();
                let mut s = base.clone();
                s.tenant = tenant_load(&id);
                gpu_eligibility(&policy, &s, remaining).unwrap();
                let slot = id.state.gpu.try_acquire(fair_share_slots(0.5, policy.gpu.max_in_flight));
                quotas.take_daily(&id.state.key, 4_000_000_000).now_or_never().unwrap().unwrap();
                drop(black_box(slot));
            })
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
