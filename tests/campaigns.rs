//! Campaign signals across a fleet: two tiergate replicas (two processes of the real binary)
//! sharing one real Redis (tests/common/redis.rs) count one template with changed names,
//! amounts and links as one campaign, and its distinct sources alike on both replicas; the
//! bundled guard `campaign_rotating_links` reviews the 51st source; an unrelated text stays a
//! campaign of one; an IBAN named in different texts has its own velocity; Redis stores no
//! entity in clear; with Redis gone the replicas keep answering from their own counts.
//! The variables are read where a caller sees them: `explain.campaign` of `?explain=true`.

mod common;

use common::redis::Redis;
use common::Sidecar;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const KEY: &str = "campaign-test-key-0123456789abcdef";
const GUARD: &str = "campaign_rotating_links";

/// A replica: the bundled model and policies, quotas and campaigns shared through `redis`.
fn replica(name: &str, redis: &Redis) -> Sidecar {
    let dir = std::env::temp_dir().join(format!("tiergate-campaigns-{name}-{}", std::process::id()));
    let extra = format!(
        "[tenants]\ndefault_class = \"standard\"\n\
         [tenants.classes.standard]\nrate = {{ per_second = 1000, burst = 1000 }}\n\
         [tenants.redis]\nurl = \"{}\"\nreplicas = 2\ntimeout_ms = 500\nopen_ms = 300\n\
         [campaign]\nenabled = true\nkey = \"{KEY}\"\n",
        redis.url()
    );
    Sidecar::serve_in(&dir, &common::repo().join("policies"), &extra)
}

/// `POST /v1/classify?explain=true` on the admin listener (where explain is served): the
/// decision (status 200 asserted).
async fn decide(replica: &Sidecar, text: &str, sender: &str) -> Value {
    let body = json!({ "text": text, "features": { "sender_id": sender } }).to_string();
    let headers = [("content-type", "application/json"), ("x-tiergate-deadline-ms", "5000")];
    let reply = common::send(replica.admin, "POST", "/v1/classify?explain=true", &headers, body).await;
    assert_eq!(reply.status, 200, "{:?}", String::from_utf8_lossy(&reply.body));
    reply.json()
}

/// The decision's campaign velocity (`explain.campaign`).
fn campaign(d: &Value) -> &Value {
    d["explain"].get("campaign").unwrap_or_else(|| panic!("no explain.campaign in {d}"))
}

fn int(v: &Value, key: &str) -> i64 {
    v[key].as_i64().unwrap_or_else(|| panic!("no int {key} in {v}"))
}

/// One template, varied as a campaign varies it: the name, the amount, the parcel number and
/// the link (a new throw-away domain per message). Worded so that the bundled model allows it
/// alone (risk about 0.02) and no rule fires: what gives it away is the campaign.
fn template(i: usize) -> String {
    const NAMES: [&str; 10] =
        ["Anna", "Li Wei", "Mohammed", "Sofia", "Jan", "Priya", "Carlos", "Yuki", "Olga", "Kwame"];
    format!(
        "Hi {}, your parcel {} is waiting at the depot. Confirm delivery of your {}.{:02} EUR order at \
         https://parcel-{i}.example/p/{} so we can bring it tomorrow.",
        NAMES[i % NAMES.len()],
        48_000 + i * 7,
        3 + i % 40,
        (i * 13) % 100,
        9_000 + i
    )
}

/// Waits until each replica has had a lookup answered by Redis (the store connects in the
/// background at start).
async fn until_shared(replicas: &[&Sidecar]) {
    for r in replicas {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !campaign(&decide(r, "warming up the connection", "warm-up").await)["shared"].as_bool().unwrap() {
            assert!(Instant::now() < deadline, "replica never reached Redis");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_from_50_sources_is_one_campaign_on_both_replicas_and_the_guard_reviews_the_51st() {
    let redis = Redis::start();
    let (a, b) = (replica("a", &redis), replica("b", &redis));
    until_shared(&[&a, &b]).await;
    let both = [&a, &b];
    let started = Instant::now();
    let mut ids = Vec::new();
    for i in 0..50 {
        let d = decide(both[i % 2], &template(i), &format!("sender-{i}")).await;
        let c = campaign(&d);
        assert!(c["shared"].as_bool().unwrap(), "Redis answered: {c}");
        let sources = int(c, "sources_1h");
        assert!((sources - (i as i64 + 1)).abs() <= 1, "request {i}: sources_1h {sources}");
        assert!(d["rule"] != GUARD || sources > 50, "request {i}: the guard fired at {sources} sources: {d}");
        if i < 45 {
            assert_eq!(d["action"], "allow", "request {i}: alone, the message passes: {d}");
        }
        ids.push(c["id"].as_str().unwrap().to_string());
    }
    assert!(started.elapsed() < Duration::from_secs(60), "the 50 sources came within a minute");
    assert!(ids.iter().all(|id| *id == ids[0]), "one campaign: {ids:?}");
    // A repeat sender on each replica: both read the fleet's 50 sources.
    for r in both {
        let c = campaign(&decide(r, &template(0), "sender-0").await).clone();
        assert_eq!(c["id"], ids[0].as_str());
        assert!((int(&c, "sources_1h") - 50).abs() <= 1, "{c}");
        assert!((int(&c, "sources_1m") - 50).abs() <= 1, "{c}");
        assert!(int(&c, "count_1h") >= 51, "{c}");
    }
    let d = decide(&a, &template(50), "sender-50").await;
    assert_eq!(d["path"][0]["tier"], "cpu", "{d}");
    assert_eq!(d["path"][0]["outcome"], "accepted", "the model alone allows it: {d}");
    assert_eq!(d["rule"], GUARD, "the 51st source is reviewed by the guard: {d}");
    assert_eq!(d["action"], "review", "{d}");
    assert!(int(campaign(&d), "sources_1h") > 50, "{d}");

    let other =
        decide(&b, "Lunch moved to 1pm tomorrow, the usual place by the river. See you there!", "sender-7").await;
    let c = campaign(&other);
    assert_ne!(c["id"], ids[0].as_str());
    assert_eq!((int(c, "count_1h"), int(c, "sources_1h"), int(c, "first_seen_s")), (1, 1, 0), "{c}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_iban_named_in_different_texts_has_its_velocity_on_both_replicas_and_is_never_stored_in_clear() {
    let mut redis = Redis::start();
    let (a, b) = (replica("iban-a", &redis), replica("iban-b", &redis));
    until_shared(&[&a, &b]).await;
    let texts = [
        "Please send the deposit to DE89 3704 0044 0532 0130 00 today.",
        "Our bank details changed: IBAN DE89370400440532013000, pay the invoice there.",
        "hey, it's me, new number. can you transfer 200 to de89 3704 0044 0532 0130 00 asap?",
        "Rent for May goes to DE89 3704 0044 0532 0130 00 from now on, thanks",
        "订金请转到 DE89370400440532013000，谢谢。",
    ];
    let mut last = Value::Null;
    for i in 0..30 {
        let d = decide([&a, &b][i % 2], texts[i % texts.len()], &format!("payer-{i}")).await;
        let ibans: Vec<&Value> =
            campaign(&d)["entities"].as_array().unwrap().iter().filter(|e| e["kind"] == "iban").collect();
        assert_eq!(ibans.len(), 1, "{d}");
        assert!((int(ibans[0], "sources_1h") - (i as i64 + 1)).abs() <= 1, "request {i}: {}", ibans[0]);
        assert!(int(campaign(&d), "sources_1h") <= 7, "five different texts, not one campaign: {d}");
        last = ibans[0].clone();
    }
    for r in [&a, &b] {
        let d = decide(r, "Final reminder: DE89 3704 0044 0532 0130 00 is the account for the fee.", "payer-0").await;
        let iban = campaign(&d)["entities"].as_array().unwrap().iter().find(|e| e["kind"] == "iban").unwrap().clone();
        assert_eq!(iban["hash"], last["hash"], "one entity, one keyed hash");
        assert!((int(&iban, "sources_1h") - 30).abs() <= 1, "{iban}");
        assert_eq!(int(&iban, "count_1h"), int(&last, "count_1h") + if r.public == a.public { 1 } else { 2 });
    }
    let keys: Vec<String> = ::redis::cmd("KEYS").arg("*").query(&mut redis.client()).unwrap();
    assert!(keys.iter().any(|k| k.contains(":entity:iban:")), "entities are kept in Redis: {keys:?}");
    for k in keys.iter().filter(|k| k.contains(":cmp:")) {
        assert!(!k.to_uppercase().contains("DE89") && !k.contains("payer-"), "an entity or a source in clear: {k}");
        let ttl: i64 = ::redis::cmd("TTL").arg(k).query(&mut redis.client()).unwrap();
        assert!(ttl > 0 && ttl <= 2 * 86_400 + 60, "every campaign key has a TTL: {k} {ttl}");
    }

    // Redis gone: both replicas keep answering, from their own counts.
    redis.stop();
    for r in [&a, &b] {
        let c = campaign(&decide(r, texts[0], "payer-99").await).clone();
        assert_eq!(c["shared"], false, "{c}");
        assert!(int(&c, "count_1h") >= 1, "{c}");
    }
}

/// One line of tests/data/bulk_legit.jsonl expanded into its messages: `(kind, sender, text)`.
fn bulk_messages(line: &Value) -> Vec<(String, String, String)> {
    const NAMES: [&str; 8] = ["王芳", "Emma", "Lucía", "Jonas", "Chloé", "李强", "Oliver", "Fatima"];
    let (kind, lang) = (line["kind"].as_str().unwrap(), line["lang"].as_str().unwrap());
    let (senders, messages) = (line["senders"].as_u64().unwrap() as usize, line["messages"].as_u64().unwrap() as usize);
    (0..messages)
        .map(|j| {
            let text = line["text"]
                .as_str()
                .unwrap()
                .replace("{name}", NAMES[j % NAMES.len()])
                .replace("{n}", &(700_000 + j * 37).to_string())
                .replace("{amount}", &format!("{}.{:02}", 5 + j % 60, (j * 29) % 100))
                .replace("{code}", &format!("{:06}", (j * 7919 + 104_729) % 1_000_000));
            (format!("{kind}/{lang}"), format!("{kind}-{lang}-{}", j % senders), text)
        })
        .collect()
}

/// Legitimate bulk traffic must not be penalised for being common: a wave of OTP notices,
/// receipts, newsletters (one sender each), forwarded viral messages and referral invites (70
/// senders each, one link domain), in Chinese, English, Spanish, German and French, interleaved
/// as they would arrive, with one scam campaign (the parcel template, 70 senders, a new domain per
/// message) mixed in. The guard's false reviews on the legitimate messages are counted (and must
/// be none); the scam's messages past its 50th source must be reviewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legitimate_bulk_wave_gets_no_campaign_review_while_a_scam_wave_in_it_does() {
    let dir = std::env::temp_dir().join(format!("tiergate-campaigns-bulk-{}", std::process::id()));
    let extra = format!("[campaign]\nenabled = true\nkey = \"{KEY}\"\n");
    let server = Sidecar::serve_in(&dir, &common::repo().join("policies"), &extra);
    let data = std::fs::read_to_string(common::repo().join("tests/data/bulk_legit.jsonl")).unwrap();
    let lines: Vec<Value> =
        data.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).unwrap()).collect();
    let mut queues: Vec<Vec<(String, String, String)>> = lines.iter().map(bulk_messages).collect();
    queues.push((0..70).map(|i| ("scam/eng".to_string(), format!("scam-{i}"), template(i))).collect());
    // Interleaved: one message of each stream in turn, as concurrent waves arrive.
    let mut wave = Vec::new();
    while queues.iter().any(|q| !q.is_empty()) {
        for q in queues.iter_mut().filter(|q| !q.is_empty()) {
            wave.push(q.remove(0));
        }
    }
    let mut tally: std::collections::BTreeMap<String, (usize, usize, usize)> = Default::default();
    for chunk in wave.chunks(4) {
        const HEADERS: [(&str, &str); 2] = [("content-type", "application/json"), ("x-tiergate-deadline-ms", "5000")];
        let sends = chunk.iter().map(|(_, sender, text)| {
            let body = json!({ "text": text, "features": { "sender_id": sender } }).to_string();
            common::send(server.public, "POST", "/v1/classify", &HEADERS, body)
        });
        for ((kind, _, _), reply) in chunk.iter().zip(futures_util::future::join_all(sends).await) {
            assert_eq!(reply.status, 200);
            let d = reply.json();
            let entry = tally.entry(kind.clone()).or_default();
            entry.0 += 1;
            entry.1 += usize::from(d["rule"] == GUARD);
            entry.2 += usize::from(d["action"] != "allow" && d["rule"] != GUARD);
        }
    }
    let legit: Vec<_> = tally.iter().filter(|(k, _)| !k.starts_with("scam")).collect();
    let (sent, by_guard, other) =
        legit.iter().fold((0, 0, 0), |(s, g, o), (_, (n, guard, other))| (s + n, g + guard, o + other));
    eprintln!("bulk wave per kind/lang (sent, reviewed by {GUARD}, not allowed for other reasons): {tally:?}");
    eprintln!(
        "legitimate: {sent} sent, {by_guard} false reviews by {GUARD}, {other} not allowed by the model or other rules"
    );
    let scam = tally["scam/eng"];
    eprintln!("scam: {} sent, {} reviewed by {GUARD}", scam.0, scam.1);
    assert_eq!(by_guard, 0, "legitimate bulk traffic reviewed for being common: {tally:?}");
    assert!(scam.1 >= 15, "the scam's messages past its 50th source are reviewed: {scam:?}");
}
