//! Micro-benchmarks of the request path without the model: extraction/validation, complexity
//! rating (text scan + token count with the real tokenizer), rules (signals + CEL) on the
//! bundled policy, temperature-scaled softmax, and the routing decisions.
//!
//! Run: `cargo bench --bench request_path`

mod common;

use criterion::{criterion_group, criterion_main, Criterion};
use http::HeaderMap;
use std::hint::black_box;
use std::path::Path;
use std::time::Duration;
use tiergate::breaker::CircuitState;
use tiergate::calibrate::softmax_t;
use tiergate::complexity::{assess, scan};
use tiergate::policy::Policy;
use tiergate::request::ClassifyRequest;
use tiergate::rules::{ModelView, RulesInput};
use tiergate::select::{after_cpu, start, CpuLoad, GpuLoad, GpuMemory, KvCache, LoadSnapshot};
use tiergate::text::Language;
use tiergate::tier::windows::TokenCounter;
use tiergate::tier::ModelVerdict;
use tiergate::web::ServerConfig;

const SHORT: &str = "Your account is locked. Confirm your password at http://secure-login.example.top/verify";
/// Non-ASCII texts: Unicode word boundaries in the signals make the regex crate's lazy DFA give up on them.
const ZH: &str = "您的账户已被冻结，请立即点击链接 http://secure-login.example.top/verify 验证您的密码和银行卡信息。";
const RU: &str =
    "Ваш аккаунт заблокирован. Подтвердите пароль по ссылке http://secure-login.example.top/verify сегодня.";

/// A request as it arrives: the body, the headers and the server's limits it is validated with.
struct Incoming {
    headers: HeaderMap,
    server: ServerConfig,
    body: String,
}

/// What the routing decisions are made on: the tiers' signals, the cpu verdict and its language.
struct Routing {
    snapshot: LoadSnapshot,
    verdict: ModelVerdict,
    english: Language,
}

fn bench(c: &mut Criterion) {
    let policy = Policy::load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap();
    let incoming = Incoming {
        headers: HeaderMap::new(),
        server: ServerConfig::default(),
        body: serde_json::json!({"text": SHORT, "features": {"amount": 120, "country": "DE"}, "tenant": "acme"})
            .to_string(),
    };
    let long = SHORT.repeat(12);

    bench_extract(c, &incoming);
    bench_rules(c, &policy, &long);
    bench_guards(c, &policy);
    bench_text(c, &policy, &long);
    let assets =
        tiergate::tier::model::ModelAssets::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("models")).unwrap();
    let counter = assets.token_counter();
    // 60 words, under tokens_full: the worst case, where the whole text is tokenised.
    let worst = "please confirm the delivery address for order 4471 and the time slot ".repeat(5);
    bench_complexity(c, &policy, &counter, &worst, &long);
    bench_ood(c);
    bench_lexical(c);
    let routing = Routing { snapshot: snapshot(), verdict: verdict(), english: english() };
    bench_route(c, &policy, &routing);
    bench_request_path(c, &policy, &counter, &routing, &incoming, &worst);
}

fn bench_extract(c: &mut Criterion, incoming: &Incoming) {
    let Incoming { headers, server, body } = incoming;
    c.bench_function("extract/classify_request", |b| {
        b.iter(|| ClassifyRequest::from_json(black_box(headers), black_box(body.as_bytes()), server).unwrap())
    });
}

fn bench_rules(c: &mut Criterion, policy: &Policy, long: &str) {
    let features = serde_json::json!({"amount": 120, "country": "DE"}).as_object().cloned().unwrap();
    let model = Some(ModelView { risk_score: 0.6, confidence: 0.6, ood_score: Some(0.4) });
    for (name, text) in [("rules/evaluate_short", SHORT), ("rules/evaluate_1k", long)] {
        c.bench_function(name, |b| {
            b.iter(|| {
                let signals = policy.rules.count_signals(black_box(text));
                policy.rules.evaluate(&RulesInput {
                    text,
                    lang: "eng",
                    obfuscation: &Default::default(),
                    signals: &signals,
                    features: &features,
                    tenant: Some("acme"),
                    model,
                    features_model: None,
                    campaign: None,
                })
            })
        });
    }
}

/// The guard stage of every request: guards, then the allow-list, over one short text's variables.
fn bench_guards(c: &mut Criterion, policy: &Policy) {
    let features = serde_json::json!({"amount": 120, "country": "DE"}).as_object().cloned().unwrap();
    let signals = policy.rules.count_signals(SHORT);
    let model = Some(ModelView { risk_score: 0.02, confidence: 0.98, ood_score: Some(0.4) });
    c.bench_function("rules/guards_and_allowlist_short", |b| {
        b.iter(|| {
            let input = RulesInput {
                text: SHORT,
                lang: "eng",
                obfuscation: &Default::default(),
                signals: black_box(&signals),
                features: &features,
                tenant: Some("acme"),
                model,
                features_model: None,
                campaign: None,
            };
            policy.rules.guard_stage(&input)
        })
    });
}

/// The OOD score of one window's embedding against the bundled model's centroids.
fn bench_ood(c: &mut Criterion) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/ood.json");
    let file: tiergate::tier::ood::OodFile = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let dim = file.centroids[0].len();
    let scorer = tiergate::tier::ood::OodScorer::new(file, Some(dim)).unwrap();
    let raw: Vec<f32> = (0..dim).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
    let norm = raw.iter().map(|x| x * x).sum::<f32>().sqrt();
    let embedding: Vec<f32> = raw.iter().map(|x| x / norm).collect();
    c.bench_function("ood/score", |b| b.iter(|| scorer.score(black_box(&embedding))));
}

/// The cpu tier's lexical model (`models/lexical.json`): its logit of a short text, a Chinese
/// one, and the largest accepted text (`max_text_bytes`, 16 KiB), which it reads whole. With
/// `LEXICAL_BASELINE=DIR` (a directory holding another `lexical.json` and its weights, e.g. the
/// previous model from git) the same texts through that one too, in the same run
/// (`lexical_baseline/...`).
fn bench_lexical(c: &mut Criterion) {
    let mut models = vec![("lexical", Path::new(env!("CARGO_MANIFEST_DIR")).join("models"))];
    if let Some(dir) = std::env::var_os("LEXICAL_BASELINE") {
        models.push(("lexical_baseline", dir.into()));
    }
    let largest: String = SHORT.repeat(16 * 1024 / SHORT.len());
    for (group, dir) in models {
        let (lexical, _) = tiergate::tier::lexical::Lexical::load(&dir, "lexical.json").unwrap();
        for (name, text) in [("short", SHORT), ("zh", ZH), ("16k", largest.as_str())] {
            c.bench_function(&format!("{group}/logit_{name}"), |b| b.iter(|| lexical.logit(black_box(text))));
        }
    }
}

fn bench_text(c: &mut Criterion, policy: &Policy, long: &str) {
    for (name, text) in [("text/short", SHORT), ("text/1k", long), ("text/zh", ZH), ("text/ru", RU)] {
        c.bench_function(&format!("{name}/canonicalize"), |b| b.iter(|| tiergate::text::canonicalize(black_box(text))));
        c.bench_function(&format!("{name}/detect"), |b| b.iter(|| tiergate::text::detect(black_box(text))));
        c.bench_function(&format!("{name}/count_signals"), |b| b.iter(|| policy.rules.count_signals(black_box(text))));
    }
    // Streams of many texts, one per iteration, in the file's order, as the server sees them:
    // the regex engines' lazy DFA caches meet many texts rather than one again and again.
    // `short`: what `benches/e2e.sh` sends (ood_short, under 160 bytes); `ml5`: blind set ml5's
    // 777 messages in 21 languages, whole.
    let short = common::texts("ood_short.jsonl", |t| t.len() < 160);
    for (name, stream) in [("short", short), ("ml5", common::texts("blind_ml5.jsonl", |_| true))] {
        let mut i = 0;
        let mut next = || {
            i += 1;
            stream[i % stream.len()].as_str()
        };
        c.bench_function(&format!("text/stream_{name}/canonicalize"), |b| {
            b.iter(|| tiergate::text::canonicalize(black_box(next())))
        });
        c.bench_function(&format!("text/stream_{name}/detect"), |b| {
            b.iter(|| tiergate::text::detect(black_box(next())))
        });
        c.bench_function(&format!("text/stream_{name}/count_signals"), |b| {
            b.iter(|| policy.rules.count_signals(black_box(next())))
        });
    }
}

fn bench_complexity(c: &mut Criterion, policy: &Policy, counter: &TokenCounter, worst: &str, long: &str) {
    let spec = &policy.complexity;
    for (name, text) in
        [("complexity/rate_short", SHORT), ("complexity/rate_60_words", worst), ("complexity/rate_1k", long)]
    {
        c.bench_function(name, |b| {
            b.iter(|| {
                // What Gateway::assess does: scan, count tokens (bounded), add signal hits.
                let mut stats = scan(black_box(text));
                stats.tokens = counter.count(text, spec.tokens_full).count;
                stats.signal_hits = policy.rules.count_signals(text).values().sum::<i64>() as usize;
                assess(&stats, spec)
            })
        });
    }
}

fn bench_route(c: &mut Criterion, policy: &Policy, routing: &Routing) {
    let Routing { snapshot, verdict, english } = routing;
    let complexity = assess(&scan(SHORT), &policy.complexity);
    c.bench_function("route/start", |b| {
        b.iter(|| start(black_box(&complexity), policy, black_box(snapshot), Duration::from_millis(200)))
    });
    c.bench_function("calibrate/softmax_t", |b| b.iter(|| softmax_t(black_box(&[1.3, -2.1]), black_box(1.37))));
    c.bench_function("route/after_cpu", |b| {
        b.iter(|| after_cpu(black_box(verdict), english, &complexity, policy, &Ok(())))
    });
}

/// The whole request path without the model, as the gateway runs it: validate the body,
/// canonical text, assess complexity (text scan, tokens, signal hits), choose the starting tier,
/// then judge the cpu verdict. Tokens: the word count where no gpu tier exists (the shipped
/// config; the cpu worker tokenises), the real tokenizer where one does (`_gpu`). The language
/// the verdict is judged with is detected on the cpu worker beside tokenisation
/// (`text/*/detect` is its cost there). `worst` is the 60-word text whose tokens are all counted.
fn bench_request_path(
    c: &mut Criterion,
    policy: &Policy,
    counter: &TokenCounter,
    routing: &Routing,
    incoming: &Incoming,
    worst: &str,
) {
    let (Incoming { headers, server, body }, spec) = (incoming, &policy.complexity);
    let Routing { snapshot, verdict, english } = routing;
    let worst_body = serde_json::json!({"text": worst, "features": {"amount": 120}}).to_string();
    for (name, body, gpu) in [
        ("request_path/short", body, false),
        ("request_path/worst", &worst_body, false),
        ("request_path/short_gpu", body, true),
        ("request_path/worst_gpu", &worst_body, true),
    ] {
        c.bench_function(name, |b| {
            b.iter(|| {
                let req = ClassifyRequest::from_json(headers, black_box(body.as_bytes()), server).unwrap();
                let canonical = tiergate::text::canonicalize(&req.text);
                let text = if canonical.obfuscation.changed { canonical.text.as_str() } else { &*req.text };
                let mut stats = scan(text);
                stats.tokens = if gpu {
                    counter.count(text, spec.tokens_full).count
                } else {
                    tiergate::tier::windows::Tokens::lower_bound(text, spec.tokens_full).count
                };
                stats.signal_hits = policy.rules.count_signals(text).values().sum::<i64>() as usize;
                stats.features = req.features.len();
                let complexity = assess(&stats, spec);
                let s = start(&complexity, policy, snapshot, req.deadline);
                (s, after_cpu(verdict, english, &complexity, policy, &Ok(())))
            })
        });
    }
}

/// The tiers' signals the routing benchmarks decide on: both tiers healthy and lightly loaded.
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

/// A confident low-risk verdict of the cpu tier.
fn verdict() -> ModelVerdict {
    ModelVerdict {
        risk_score: 0.03,
        confidence: 0.97,
        ood_score: Some(0.4),
        tokens: Some(24),
        queue_us: 0,
        infer_us: 0,
        batch_size: 1,
        endpoint: None,
        window: None,
        unread: false,
    }
}

/// The language the verdict is judged with: reliably detected English.
fn english() -> Language {
    Language { code: "eng", guess: "eng", script: "Latn", confidence: 0.9, reliable: true, elsewhere: None }
}

criterion_group!(benches, bench);
criterion_main!(benches);
