//! Every branch of tier selection, with hand-built signals (no threads, no clocks).

use super::*;
use crate::breaker::CircuitState;
use crate::complexity::Complexity;
use crate::policy::Policy;
use crate::text::Language;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub(super) fn policy(extra: &str) -> Policy {
    let text = format!(
        r#"
        [actions]
        review_at = 0.3
        block_at = 0.8
        [cascade]
        escalate_below = 0.9
        accept_below = 0.7
        ood_above = 0.95
        [default]
        action = "allow"
        score = 0.2
        [cpu]
        max_utilization = 0.9
        max_queue_depth = 10
        [gpu]
        min_free_memory_mb = 2048
        max_in_flight = 4
        min_kv_cache_headroom = 0.1
        {extra}
        "#
    );
    Policy::from_sources(Path::new("p"), &[(PathBuf::from("p/routing.toml"), text)]).unwrap()
}

pub(super) fn idle() -> LoadSnapshot {
    LoadSnapshot {
        tenant: Default::default(),
        confirm: false,
        cpu: CpuLoad {
            utilization: Some(0.2),
            queue_depth: 0,
            in_flight: 0,
            service_us: Some(5_000),
            queue_wait_us: Some(0),
        },
        gpu: GpuLoad {
            unavailable: None,
            memory: GpuMemory::FreeMb(40_000),
            utilization: Some(0.1),
            in_flight: 0,
            p95_us: Some(50_000),
            queue_wait_us: None,
            ewma_us: Some(40_000),
            circuit: CircuitState::Closed,
            kv_cache: KvCache::NotExposed,
            was_below: Default::default(),
            endpoints_available: None,
        },
    }
}

pub(super) fn complexity(score: f64) -> Complexity {
    Complexity { score, contributions: BTreeMap::from([("tokens", score)]) }
}

pub(super) fn verdict(confidence: f64, ood: Option<f64>) -> ModelVerdict {
    ModelVerdict {
        risk_score: confidence,
        confidence,
        ood_score: ood,
        tokens: Some(10),
        queue_us: 0,
        infer_us: 0,
        batch_size: 1,
        endpoint: None,
        window: None,
        unread: false,
    }
}

/// An English text, as `text::detect` reports one.
pub(super) fn en() -> Language {
    Language { code: "eng", guess: "eng", script: "Latn", confidence: 0.9, reliable: true, elsewhere: None }
}

pub(super) const PLENTY: Duration = Duration::from_millis(200);

#[test]
fn simple_requests_start_on_cpu_complex_ones_on_gpu() {
    let p = policy("");
    let s = start(&complexity(0.3), &p, &idle(), PLENTY);
    assert_eq!(s.stage, Stage::Cpu);
    assert!(s.reason.contains("within cpu_max_complexity 0.7"), "{}", s.reason);
    let s = start(&complexity(0.8), &p, &idle(), PLENTY);
    assert_eq!(s.stage, Stage::Gpu);
    assert!(s.reason.contains("above cpu_max_complexity 0.7"), "{}", s.reason);
}

#[test]
fn complex_request_stays_on_cpu_when_gpu_is_ineligible() {
    let p = policy("");
    let mut sig = idle();
    sig.gpu.memory = GpuMemory::FreeMb(1000);
    let s = start(&complexity(0.8), &p, &sig, PLENTY);
    assert_eq!(s.stage, Stage::Cpu);
    assert!(s.reason.contains("gpu free memory 1000 MiB below min_free_memory_mb 2048"), "{}", s.reason);
}

#[test]
fn saturated_cpu_sends_work_to_gpu() {
    let p = policy("");
    let mut sig = idle();
    sig.cpu.utilization = Some(0.97);
    let s = start(&complexity(0.1), &p, &sig, PLENTY);
    assert_eq!(s.stage, Stage::Gpu);
    assert!(s.reason.contains("cpu utilization 0.97 above max_utilization 0.9"), "{}", s.reason);
    let mut sig = idle();
    sig.cpu.queue_depth = 11;
    assert_eq!(start(&complexity(0.1), &p, &sig, PLENTY).cpu, Err(Ineligible::QueueDepth { depth: 11, max: 10 }));
    assert_eq!(
        Ineligible::QueueDepth { depth: 11, max: 10 }.to_string(),
        "cpu queue depth 11 above max_queue_depth 10"
    );
}

#[test]
fn both_saturated_goes_to_rules_or_sheds_as_the_policy_says() {
    let mut sig = idle();
    sig.cpu.utilization = Some(0.99);
    sig.gpu.in_flight = 4;
    let s = start(&complexity(0.1), &policy(""), &sig, PLENTY);
    assert_eq!(s.stage, Stage::Rules);
    assert!(s.reason.contains("no model tier can take it"), "{}", s.reason);
    assert!(s.reason.contains("gpu admission: 4 in flight, max_in_flight 4"), "{}", s.reason);
    let shed = policy("[routing]\nwhen_saturated = \"shed\"\n");
    assert_eq!(start(&complexity(0.1), &shed, &sig, PLENTY).stage, Stage::Shed);
}

#[test]
fn every_gpu_ineligibility_has_its_reason() {
    let p = policy("");
    let check = |f: &dyn Fn(&mut LoadSnapshot), remaining: Duration, want: &str| {
        let mut sig = idle();
        f(&mut sig);
        let got = gpu_eligibility(&p, &sig, remaining).unwrap_err().to_string();
        assert!(got.contains(want), "want {want:?}, got {got:?}");
    };
    check(&|s| s.gpu.unavailable = Some("no gpu tier configured".into()), PLENTY, "no gpu tier configured");
    check(&|s| s.gpu.circuit = CircuitState::Open, PLENTY, "gpu circuit open");
    check(&|s| s.gpu.in_flight = 9, PLENTY, "gpu admission");
    check(&|s| s.gpu.memory = GpuMemory::FreeMb(10), PLENTY, "below min_free_memory_mb");
    check(&|s| s.gpu.kv_cache = KvCache::Headroom(0.05), PLENTY, "KV-cache headroom 0.05");
    check(&|s| s.gpu.endpoints_available = Some(0), PLENTY, "no healthy upstream endpoint");
    check(
        &|_| {},
        Duration::from_millis(20),
        "remaining deadline 20 ms does not cover gpu queue wait 0.0 ms + service 50.0 ms",
    );
    // Half-open lets a probe through; no GPU on the machine (CPU provider) is not a memory problem.
    let mut sig = idle();
    sig.gpu.circuit = CircuitState::HalfOpen;
    sig.gpu.memory = GpuMemory::NotPresent("no CUDA driver".into());
    assert_eq!(gpu_eligibility(&p, &sig, PLENTY), Ok(()));
}

#[test]
fn unknown_signals_count_as_the_policy_says() {
    let mut sig = idle();
    sig.cpu.utilization = None;
    sig.gpu.memory = GpuMemory::Unknown;
    let open = policy("");
    assert_eq!(cpu_eligibility(&open, &sig, PLENTY), Ok(()));
    assert_eq!(gpu_eligibility(&open, &sig, PLENTY), Ok(()));
    let closed = policy("[routing]\nunknown_signals = \"ineligible\"\n");
    assert!(cpu_eligibility(&closed, &sig, PLENTY).unwrap_err().to_string().contains("unknown"));
    assert!(gpu_eligibility(&closed, &sig, PLENTY).unwrap_err().to_string().contains("unknown"));
}

#[test]
fn an_unknown_kv_cache_counts_as_the_policy_says_and_not_exposed_means_no_limit() {
    let mut sig = idle();
    sig.gpu.kv_cache = KvCache::Unknown;
    assert_eq!(gpu_eligibility(&policy(""), &sig, PLENTY), Ok(()));
    let closed = policy("[routing]\nunknown_signals = \"ineligible\"\n");
    let e = gpu_eligibility(&closed, &sig, PLENTY).unwrap_err().to_string();
    assert_eq!(e, "upstream KV-cache headroom unknown (unknown_signals = \"ineligible\")");
    sig.gpu.kv_cache = KvCache::NotExposed;
    assert_eq!(gpu_eligibility(&closed, &sig, PLENTY), Ok(()));
}

/// Eligibility over a sequence of readings, fed back as the gateway does; the number of flips.
fn flips(p: &Policy, readings: &[(KvCache, GpuMemory)]) -> usize {
    let (mut was, mut last, mut flips) = (Below::default(), None, 0);
    for (kv, memory) in readings {
        let mut sig = idle();
        (sig.gpu.kv_cache, sig.gpu.memory, sig.gpu.was_below) = (*kv, memory.clone(), was);
        let ok = gpu_eligibility(p, &sig, PLENTY).is_ok();
        flips += (last.is_some_and(|l| l != ok)) as usize;
        last = Some(ok);
        was = gpu_below(&sig.gpu, &p.gpu);
    }
    flips
}

#[test]
fn a_reading_hovering_around_a_limit_does_not_flip_routing() {
    // KV headroom 0.07 / 0.13 in turn around min 0.1 (usage 0.93 / 0.87), ten scrapes; then
    // free memory 2000 / 2100 MiB around min 2048.
    let kv: Vec<_> = (0..10).map(|i| (KvCache::Headroom([0.07, 0.13][i % 2]), GpuMemory::FreeMb(40_000))).collect();
    let mem: Vec<_> = (0..10).map(|i| (KvCache::NotExposed, GpuMemory::FreeMb([2000, 2100][i % 2]))).collect();
    let p = policy("");
    assert_eq!((flips(&p, &kv), flips(&p, &mem)), (0, 0), "below once, it stays below inside the band");
    let bare = policy("kv_cache_hysteresis = 0.0\nfree_memory_hysteresis_mb = 0");
    assert_eq!((flips(&bare, &kv), flips(&bare, &mem)), (9, 9), "without hysteresis, every reading flips");
    // Past the band it comes back; unknown readings in between keep the state.
    let back = [
        (KvCache::Headroom(0.07), GpuMemory::FreeMb(40_000)),
        (KvCache::Unknown, GpuMemory::FreeMb(40_000)),
        (KvCache::Headroom(0.13), GpuMemory::FreeMb(40_000)),
        (KvCache::Headroom(0.16), GpuMemory::FreeMb(40_000)),
    ];
    let closed = policy("[routing]\nunknown_signals = \"ineligible\"\n");
    assert_eq!(flips(&closed, &back), 1, "0.13 after an unknown reading is still below");
    assert!(!below_limit(true, 0.16, 0.1, 0.05) && below_limit(true, 0.14, 0.1, 0.05));
}

#[test]
fn a_stage_with_no_time_left_is_skipped_even_with_nothing_known() {
    let mut sig = idle();
    (sig.gpu.p95_us, sig.gpu.queue_wait_us, sig.cpu.service_us, sig.cpu.queue_wait_us) = (None, None, None, None);
    for e in [
        gpu_eligibility(&policy(""), &sig, Duration::ZERO).unwrap_err(),
        cpu_eligibility(&policy(""), &sig, Duration::ZERO).unwrap_err(),
    ] {
        assert!(matches!(e, Ineligible::Deadline { .. }), "{e}");
    }
    assert_eq!(gpu_eligibility(&policy(""), &sig, Duration::from_millis(1)), Ok(()));
}

#[test]
fn cpu_deadline_is_compared_with_its_service_time() {
    let mut sig = idle();
    sig.cpu.service_us = Some(30_000);
    let e = cpu_eligibility(&policy(""), &sig, Duration::from_millis(10)).unwrap_err().to_string();
    assert_eq!(e, "remaining deadline 10 ms does not cover cpu queue wait 0.0 ms + service 30.0 ms");
}

#[test]
fn admission_refuses_a_job_whose_expected_wait_exceeds_its_deadline() {
    // 5 ms per batch; 8 jobs queued at 25 ms each over 2 workers: 100 ms of wait.
    let mut sig = idle();
    sig.cpu.queue_depth = 8;
    sig.cpu.queue_wait_us = Some(crate::tier::service::queue_wait_us(8, Some(25_000), 2).unwrap());
    let mut p = policy("");
    p.cpu.max_queue_wait_share = 1.0; // the deadline decides here
    let e = cpu_eligibility(&p, &sig, Duration::from_millis(90)).unwrap_err();
    assert_eq!(e.to_string(), "remaining deadline 90 ms does not cover cpu queue wait 100.0 ms + service 5.0 ms");
    assert_eq!(cpu_eligibility(&p, &sig, Duration::from_millis(106)), Ok(()));
    // Refused by the cpu tier: the request starts on the gpu tier at once, or on rules.
    assert_eq!(start(&complexity(0.1), &p, &sig, Duration::from_millis(90)).stage, Stage::Gpu);
    sig.gpu.in_flight = 9;
    assert_eq!(start(&complexity(0.1), &p, &sig, Duration::from_millis(90)).stage, Stage::Rules);
    // The policy's target queue wait refuses sooner than the deadline would.
    p.cpu.max_queue_wait_share = 0.25;
    let e = cpu_eligibility(&p, &sig, Duration::from_millis(200)).unwrap_err();
    assert_eq!(e.to_string(), "cpu queue wait 100.0 ms above max_queue_wait_share 0.25 of the remaining 200 ms");
    assert_eq!(cpu_eligibility(&p, &sig, Duration::from_millis(500)), Ok(()), "a longer deadline may wait longer");
    p.cpu.max_queue_wait_share = 1.0;
    // The queue drained: admitted again (no latching).
    sig.cpu.queue_wait_us = Some(0);
    assert_eq!(start(&complexity(0.1), &p, &sig, Duration::from_millis(90)).stage, Stage::Cpu);
    // An unknown estimate (stale: nothing ran for a while) probes the tier.
    sig.cpu.queue_wait_us = None;
    sig.cpu.service_us = None;
    assert_eq!(cpu_eligibility(&p, &sig, Duration::from_millis(1)), Ok(()));
}

#[test]
fn gpu_is_left_only_when_untried_and_eligible() {
    let p = policy("");
    let untried = Tried::default();
    assert_eq!(gpu_left(untried, &p, &idle(), PLENTY), Ok(()));
    assert_eq!(gpu_left(Tried { cpu: true, gpu: true }, &p, &idle(), PLENTY), Err(Ineligible::AlreadyTried));
    let mut sig = idle();
    sig.gpu.circuit = CircuitState::Open;
    assert_eq!(gpu_left(untried, &p, &sig, PLENTY), Err(Ineligible::CircuitOpen));
}

#[test]
fn a_failed_tier_hands_over_to_the_other_model_tier_once() {
    let cpu_only = Tried { cpu: true, gpu: false };
    assert_eq!(after_failure(TierName::Cpu, cpu_only, Ok(())), Fallback::Try(Stage::Gpu));
    assert_eq!(
        after_failure(TierName::Cpu, cpu_only, Err(Ineligible::CircuitOpen)),
        Fallback::Rules { skipped: Some((TierName::Gpu, Ineligible::CircuitOpen)) }
    );
    let gpu_only = Tried { cpu: false, gpu: true };
    assert_eq!(after_failure(TierName::Gpu, gpu_only, Ok(())), Fallback::Try(Stage::Cpu));
    // Both tried: rules, and nothing is reported as skipped.
    let both = Tried { cpu: true, gpu: true };
    assert_eq!(after_failure(TierName::Gpu, both, Ok(())), Fallback::Rules { skipped: None });
    assert_eq!(after_failure(TierName::Cpu, both, Err(Ineligible::AlreadyTried)), Fallback::Rules { skipped: None });
}

#[test]
fn a_failed_escalation_keeps_a_cpu_verdict_that_would_stand_alone() {
    let p = policy("");
    // 0.8 is below escalate_below 0.9 but above accept_below 0.7: it stands without the gpu tier.
    match after_failed_escalation(&verdict(0.8, Some(0.5)), &en(), &complexity(0.2), &p, Outcome::Timeout) {
        Next::Accept { note: Some(note) } => assert!(note.contains("gpu ineligible: gpu tier timeout"), "{note}"),
        other => panic!("{other:?}"),
    }
    let rules = after_failed_escalation(&verdict(0.6, Some(0.5)), &en(), &complexity(0.2), &p, Outcome::Error);
    assert!(matches!(rules, Next::Rules { outcome: Outcome::LowConfidence, .. }), "{rules:?}");
    let ood = after_failed_escalation(&verdict(0.99, Some(0.99)), &en(), &complexity(0.2), &p, Outcome::Shed);
    assert!(matches!(ood, Next::Rules { outcome: Outcome::OutOfDistribution, .. }), "{ood:?}");
}

#[test]
fn tier_errors_name_their_outcome() {
    assert_eq!(Outcome::from(&TierError::Overloaded { capacity: 1 }), Outcome::Shed);
    assert_eq!(Outcome::from(&TierError::DeadlineExceeded { waited_us: 1 }), Outcome::Timeout);
    assert_eq!(Outcome::from(&TierError::CircuitOpen), Outcome::CircuitOpen);
    assert_eq!(Outcome::from(&TierError::Inference("x".into())), Outcome::Error);
    assert_eq!(serde_json::to_value(Outcome::OutOfDistribution).unwrap(), "out_of_distribution");
}

#[test]
fn a_non_finite_verdict_is_never_accepted() {
    let p = policy("");
    let mut nan = verdict(0.99, Some(0.5));
    nan.confidence = f64::NAN;
    nan.risk_score = f64::NAN;
    // Not accepted, whether the gpu tier is there (escalate) or not (rules).
    assert!(matches!(
        after_cpu(&nan, &en(), &complexity(0.2), &p, &Ok(())),
        Next::Escalate { outcome: Outcome::Error, .. }
    ));
    let none = Err(Ineligible::NotConfigured("none".into()));
    assert!(matches!(after_cpu(&nan, &en(), &complexity(0.2), &p, &none), Next::Rules { outcome: Outcome::Error, .. }));
    assert!(matches!(after_gpu(&nan, &p), Next::Rules { outcome: Outcome::Error, .. }));
    let mut inf_ood = verdict(0.99, Some(f64::INFINITY));
    inf_ood.ood_score = Some(f64::NAN);
    assert!(matches!(
        after_cpu(&inf_ood, &en(), &complexity(0.2), &p, &none),
        Next::Rules { outcome: Outcome::Error, .. }
    ));
}

#[test]
fn text_in_another_language_never_gets_a_cpu_verdict() {
    let p = policy("");
    let fr = Language { code: "fra", guess: "fra", script: "Latn", confidence: 0.9, reliable: true, elsewhere: None };
    let none = Err(Ineligible::NotConfigured("none".into()));
    match after_cpu(&verdict(0.99, Some(0.5)), &fr, &complexity(0.2), &p, &none) {
        Next::Rules { outcome: Outcome::Language, reason } => assert!(reason.contains("language fra"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(after_cpu(&verdict(0.99, Some(0.5)), &fr, &complexity(0.2), &p, &Ok(())), Next::Escalate { .. }));
    // A short text with an unsure guess stays with the model; a non-Latin script does not.
    let short =
        Language { code: "und", guess: "spa", script: "Latn", confidence: 0.2, reliable: false, elsewhere: None };
    assert_eq!(after_cpu(&verdict(0.99, Some(0.5)), &short, &complexity(0.2), &p, &none), Next::Accept { note: None });
    let cyrillic =
        Language { code: "und", guess: "rus", script: "Cyrl", confidence: 0.3, reliable: false, elsewhere: None };
    assert!(matches!(
        after_cpu(&verdict(0.99, Some(0.5)), &cyrillic, &complexity(0.2), &p, &none),
        Next::Rules { outcome: Outcome::Language, .. }
    ));
    let mut multilingual = policy("");
    multilingual.cascade.model_languages.push("fra".into());
    assert_eq!(
        after_cpu(&verdict(0.99, Some(0.5)), &fr, &complexity(0.2), &multilingual, &none),
        Next::Accept { note: None }
    );
}

#[test]
fn unread_text_hands_over_an_ok_verdict_but_not_a_risk_one() {
    let p = policy("");
    let none = Err(Ineligible::NotConfigured("none".into()));
    let mut ok = verdict(0.97, Some(0.5));
    ok.risk_score = 0.03;
    ok.unread = true;
    assert!(matches!(after_cpu(&ok, &en(), &complexity(0.2), &p, &none), Next::Rules { outcome: Outcome::Unread, .. }));
    let mut risk = verdict(0.97, Some(0.5));
    risk.unread = true;
    assert_eq!(after_cpu(&risk, &en(), &complexity(0.2), &p, &none), Next::Accept { note: None });
    // The gpu tier reads the same windows: its ok on them clears nothing past them (issue 25,
    // item 8), its risk verdict stands.
    assert!(matches!(after_gpu(&ok, &p), Next::Rules { outcome: Outcome::Unread, .. }));
    assert_eq!(after_gpu(&risk, &p), Next::Accept { note: None });
}

/// A tenant holding `in_flight` gpu slots under a class with `share` of the tier.
fn tenant(name: &str, in_flight: usize, share: Option<f64>) -> TenantLoad {
    TenantLoad { tenant: name.into(), gpu_in_flight: in_flight, gpu_share: share, gpu_budget_spent: None }
}

#[test]
fn a_tenant_at_its_gpu_share_is_routed_down_while_another_tenant_gets_the_gpu() {
    // max_in_flight 4, gpu_share 0.5: two slots per tenant.
    let p = policy("");
    let mut busy = idle();
    busy.gpu.in_flight = 2;
    busy.tenant = tenant("chat", 2, Some(0.5));
    let s = start(&complexity(0.8), &p, &busy, PLENTY);
    assert_eq!(s.stage, Stage::Cpu, "{}", s.reason);
    let why = Ineligible::TenantGpuShare { tenant: "chat".into(), in_flight: 2, share: 0.5, slots: 2 };
    assert_eq!(s.gpu, Err(why.clone()));
    assert!(s.reason.contains("tenant chat at its gpu fair share: 2 in flight, gpu_share 0.5 of max_in_flight = 2"));
    assert!(!why.is_capacity(), "a tenant's share is not overload: on_overload = \"shed\" must not answer 503");
    // The same load, another tenant of the class: the gpu tier takes it.
    let mut other = busy.clone();
    other.tenant = tenant("payments", 0, Some(0.5));
    assert_eq!(start(&complexity(0.8), &p, &other, PLENTY).stage, Stage::Gpu);
    // After the cpu tier, an unsure verdict is not escalated for the tenant at its share.
    let gpu = gpu_left(Tried { cpu: true, gpu: false }, &p, &busy, PLENTY);
    match after_cpu(&verdict(0.8, Some(0.5)), &en(), &complexity(0.8), &p, &gpu) {
        Next::Accept { note: Some(note) } => assert!(note.contains("at its gpu fair share"), "{note}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        after_cpu(
            &verdict(0.8, Some(0.5)),
            &en(),
            &complexity(0.8),
            &p,
            &gpu_left(Tried::default(), &p, &other, PLENTY)
        ),
        Next::Escalate { .. }
    ));
}

#[test]
fn tenant_gpu_limits_share_rounding_and_budget() {
    let p = policy("");
    // No share configured: no tenant limit, whatever it holds.
    assert_eq!(tenant_gpu_eligibility(&tenant("a", 3, None), 4), Ok(()));
    // 0.1 of 4 rounds up to one slot: a small class still reaches the tier.
    assert_eq!(tenant_gpu_eligibility(&tenant("a", 0, Some(0.1)), 4), Ok(()));
    assert!(tenant_gpu_eligibility(&tenant("a", 1, Some(0.1)), 4).is_err());
    // A spent daily budget closes the gpu tier to the tenant, with the reason in words.
    let mut s = idle();
    s.tenant = TenantLoad { gpu_budget_spent: Some(1000), ..tenant("other", 0, None) };
    let why = gpu_eligibility(&p, &s, PLENTY).unwrap_err();
    assert_eq!(why, Ineligible::TenantGpuBudget { tenant: "other".into(), per_day: 1000 });
    assert_eq!(why.to_string(), "tenant other spent its gpu_daily_budget of 1000 calls (renews at midnight UTC)");
    assert_eq!(why.limit_name(), "gpu_daily_budget");
    // A gpu tier that is not configured says so first.
    s.gpu.unavailable = Some("no gpu tier configured".into());
    assert!(matches!(gpu_eligibility(&p, &s, PLENTY), Err(Ineligible::NotConfigured(_))));
}

#[test]
fn a_later_part_in_a_language_the_model_does_not_read_is_foreign() {
    let p = policy("");
    let mut mixed = en();
    mixed.elsewhere = Some(crate::text::Elsewhere { code: "und", script: "Cyrl" });
    assert!(foreign(&mixed, &p).unwrap().contains("Cyrl script"), "{:?}", foreign(&mixed, &p));
    mixed.elsewhere = Some(crate::text::Elsewhere { code: "spa", script: "Latn" });
    assert!(foreign(&mixed, &p).unwrap().contains("language spa"));
    let mut multilingual = policy("");
    multilingual.cascade.model_languages.push("spa".into());
    assert_eq!(foreign(&mixed, &multilingual), None, "a language the model reads is not foreign anywhere");
}

#[test]
fn served_scripts_and_mixtures_are_not_foreign() {
    // Issue 26: the gate judges scripts too, so a multilingual model can serve Chinese, code-mixed
    // Chinese/English and short texts whose language is unsure but whose script is known.
    let p = policy("");
    let zh = Language { code: "und", guess: "cmn", script: "Hani", confidence: 0.4, reliable: false, elsewhere: None };
    assert!(foreign(&zh, &p).unwrap().contains("Hani script"), "{:?}", foreign(&zh, &p));
    let mut mixed = en();
    mixed.elsewhere = Some(crate::text::Elsewhere { code: "und", script: "Hani" });
    assert!(foreign(&mixed, &p).unwrap().contains("Hani script"));
    let mut multilingual = policy("");
    multilingual.cascade.model_languages.push("cmn".into());
    multilingual.cascade.model_scripts.push("Hani".into());
    assert_eq!(foreign(&zh, &multilingual), None, "a served script with an unsure language is read");
    assert_eq!(foreign(&mixed, &multilingual), None, "code-mixed chat in served scripts is read");
    let cmn = Language { code: "cmn", reliable: true, confidence: 0.9, ..zh };
    assert_eq!(foreign(&cmn, &multilingual), None);
    // A served script does not serve every language written in it.
    let ru = Language { code: "rus", guess: "rus", script: "Cyrl", confidence: 0.9, reliable: true, elsewhere: None };
    multilingual.cascade.model_scripts.push("Cyrl".into());
    assert!(foreign(&ru, &multilingual).unwrap().contains("language rus"));
    let mut ukr_later = cmn;
    ukr_later.elsewhere = Some(crate::text::Elsewhere { code: "ukr", script: "Cyrl" });
    assert!(foreign(&ukr_later, &multilingual).unwrap().contains("language ukr"));
}

#[test]
fn a_neighbour_the_detector_confuses_with_a_served_language_is_read_as_it() {
    let mut p = policy("");
    p.cascade.model_languages.push("ind".into());
    let jav = Language { code: "jav", guess: "jav", script: "Latn", confidence: 0.6, reliable: true, elsewhere: None };
    assert!(foreign(&jav, &p).unwrap().contains("language jav"), "no entry: foreign");
    p.cascade.language_neighbours.insert("jav".into(), "ind".into());
    assert_eq!(foreign(&jav, &p), None);
    // Only while the language it stands for is served.
    p.cascade.language_neighbours.insert("bul".into(), "rus".into());
    let bul = Language { code: "bul", guess: "bul", script: "Latn", ..jav };
    assert!(foreign(&bul, &p).unwrap().contains("language bul"));
}
