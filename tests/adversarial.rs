//! The evasion check sets (`tests/data/adversarial*.jsonl`: 222, 147, 134 and 85 messages
//! written by kind; the model never trained or calibrated on them, the bundled rules were tuned
//! on them, see [`CHECK_SETS`]) through the whole cascade with the bundled policy and model. Prints the table per kind and set. The target (issue 11) is no risk message allowed, no
//! ordinary message blocked and label accuracy >= 0.95; the bounds asserted here are a ratchet at
//! what the shipped model and policy reach today, so nothing gets worse unnoticed: lower them as
//! the model improves, never raise them.

mod common;
use common::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// (file, most risk messages allowed, most ordinary messages blocked, least label accuracy).
/// `adversarial.jsonl` (222) was written first; `adversarial_b.jsonl` (147: other languages,
/// business e-mail compromise, stranger openers, hard negatives) was written later by a helper
/// that never saw the rules or the data, measured once as written (accuracy 0.769, 6 risk allowed,
/// 4 ordinary blocked), and the bundled rules were tuned on both since: see the model card.
/// `adversarial_c.jsonl` (134: obfuscation, other languages, a confident model that a rule must
/// overrule, benign text that looks risky) and `adversarial_d.jsonl` (85: requests to pass on a
/// one-time code and genuine code notices, wallet addresses, defanged links in ordinary mail and
/// in security reports) came from two more such helpers and were measured as written (c: 4 risk
/// allowed, 1 ordinary blocked; d: 3 and 2 after the guards that c prompted) before the rules
/// were tuned on them.
const CHECK_SETS: [(&str, usize, usize, f64); 4] = [
    // 0.98 with the English model until 2026-12-04; the multilingual model that replaced it
    // (models/MODEL_CARD.md, "The earlier check sets") sends 11 of its ordinary long mails,
    // newsletters and security reports to review (labelled risk) rather than allowing them, and
    // still allows no scam and blocks nothing ordinary here. Its b, c and d figures are better.
    // Round 7 (2026-12-05): 0.977; round 8: 0.982; round 9: 0.977; with the lexical model: 0.973
    // (a supplier's ordinary PO update that mentions bank details goes to review labelled risk).
    ("tests/data/adversarial.jsonl", 0, 0, 0.97),
    // 0.90 until the language gate read past the first window (issue 25, item 3): a Japanese
    // parcel scam whose URL outnumbers each Japanese script's letters was read by the English
    // model (risk 0.97, right by luck); it now goes to the rules as a Japanese text (review, the
    // default's label ok), as every text in a language the model was not trained on does.
    // Round 6 (2026-12-05) blocks one ordinary message fewer here (3 -> 1); round 7: 0.912.
    // Round 8 (2026-12-05) allowed one more (a calm "our remit-to details for ACH have
    // changed", 0.898 here); round 9 allows 3 and blocks none again (0.918); with the lexical model 3 and 1
    // (a genuine supplier-bank-change verification, "I rang your AP line on the number in our
    // contract", p 0.99), 0.918; round 14: 3, 1, 0.925. Round 18 (2026-12-06, distilled from the 12-layer teacher)
    // allows one more, an investment opener that asks for nothing yet ("it's Tyler from Saturday's
    // party ... crazy returns with this trading app, I'd love to show you", p 0.091; round 14
    // sent it to review at 0.4), 0.905: the price of a model that on the fresh blind set ml22 cut
    // review from 15.9 % to 11.8 % at 0.948 against 0.940 (models/MODEL_CARD.md, "Round 18").
    // Round 21 (2026-12-06, evening) allows one more opener that asks for nothing yet ("Hey, long
    // time no see! ... This is Amy, do you remember me?", p 0.072; round 18 sent it to review),
    // 0.925: all five allowed here are such openers. The price of a model that on the spent sets
    // cut review 9.7 % -> 8.1 % for the same blocks and on the fresh ml25 11.2 % -> 8.8 % with
    // one scam fewer allowed (models/MODEL_CARD.md, "Round 21"). Round 22 (the same evening)
    // allows four again (Amy's opener goes back to review), 0.925. Round 28 (2026-12-07) with
    // accept_below 0.94: 3, 1, 0.925.
    ("tests/data/adversarial_b.jsonl", 4, 1, 0.90),
    // 0 allowed and 0.98 until round 7 (2026-12-05), which allows one gift-card demand ("send me
    // 150 in Amazon vouchers and I'll forward your tickets", p(risk) 0.034; 0.978 here). Round 7
    // was served for blind set ml8 (scams allowed 13 -> 8 of 420, accuracy 0.904 -> 0.917) and
    // the other sets (models/MODEL_CARD.md, "Round 7"); this one is its regression. With the
    // lexical model (2026-12-05): 0.970, 1 and 0; with its round-10 data 0 and 0 again. Round 12
    // (encoder and lexical model, 2026-12-05) allows the voucher demand again (p 0.065; 0.963
    // here), the price of a model that on the fresh blind set ml15 allowed 3 scams where the one
    // before allowed 6, at 0.964 against 0.944 (models/MODEL_CARD.md, "Round 12"). Round 14: 0, 0,
    // 0.970; round 18: 0, 0, 0.993. Round 22 (2026-12-06, evening): 0, 0, 0.985 — one more message
    // where a rule should win goes to review with the other label (models/MODEL_CARD.md, "Round 22").
    // Round 28 (2026-12-07): 0, 0, 0.985 (round 26's lexical model: 0.993).
    ("tests/data/adversarial_c.jsonl", 0, 0, 0.98),
    // 0.91 until round 6 (2026-12-05): it allows and blocks nothing here (was 2 and 1 allowed by
    // the bounds), but two more of its risk messages go to review by the rules' default instead
    // of a confident model verdict (0.929 -> 0.906; models/MODEL_CARD.md).
    // Round 7 (2026-12-05): 0.965. Rounds 8 and 9: 0.953 (two short scams, a Netflix card-update
    // link and a neighbour's "send me the code", go to review by the rules labelled ok; still 0
    // and 0). Round 21 (2026-12-06, evening): 0.941, still 0 and 0 — two requests for a code (a
    // neighbour's "sent to you by accident", which round 18 blocked, and an MFA approval) go to
    // review by the rules' default, labelled ok; a defanged "photos of you" link moves to review
    // labelled risk. Round 22 (the same evening): 0.953 again. The lexical model retrained on every
    // round (rounds 25 and 26, 2026-12-06, night): 0.941, still 0 and 0 — a genuine WhatsApp code
    // notice ("tap this link to verify ... don't share this code") goes to review as leaning risky
    // (0.73); the price of 49 -> 27 scams allowed and 35 -> 26 ordinary blocked on the spent sets
    // (models/MODEL_CARD.md, "Lexical model rounds 25-27"). Round 28 (2026-12-07): 0.953, 0 and 0,
    // so the bound is back at 0.95.
    ("tests/data/adversarial_d.jsonl", 0, 0, 0.95),
];

#[tokio::test]
async fn the_evasion_check_sets_never_get_worse() {
    let addr = default_server();
    for (file, max_risk_allowed, max_ok_blocked, min_accuracy) in CHECK_SETS {
        let rows: Vec<Value> = std::fs::read_to_string(repo().join(file))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(rows.len() >= 80, "{file}: {} messages", rows.len());
        let [n, correct, risk_allowed, ok_blocked] = run(addr, file, &rows).await;
        let accuracy = correct as f64 / n as f64;
        assert!(
            risk_allowed <= max_risk_allowed,
            "{file}: {risk_allowed} risk messages allowed (at most {max_risk_allowed})"
        );
        assert!(
            ok_blocked <= max_ok_blocked,
            "{file}: {ok_blocked} ordinary messages blocked (at most {max_ok_blocked})"
        );
        assert!(accuracy >= min_accuracy, "{file}: label accuracy {accuracy:.3} (at least {min_accuracy})");
    }
}

/// Classifies every row, prints misses and the table per kind; returns the totals
/// [n, correct label, risk allowed, ok blocked].
async fn run(addr: std::net::SocketAddr, file: &str, rows: &[Value]) -> [usize; 4] {
    // kind -> [n, correct label, risk allowed, ok blocked]
    let mut by_kind: BTreeMap<String, [usize; 4]> = BTreeMap::new();
    for row in rows {
        let d = classify_unhurried(addr, json!({"text": row["text"]})).await.json();
        let risk = row["label"] == 1;
        let t = by_kind.entry(row["kind"].as_str().unwrap().to_string()).or_default();
        t[0] += 1;
        t[1] += ((d["label"] == "risk") == risk) as usize;
        t[2] += (risk && d["action"] == "allow") as usize;
        t[3] += (!risk && d["action"] == "block") as usize;
        if (risk && d["action"] == "allow") || (!risk && d["action"] == "block") {
            let text: String = row["text"].as_str().unwrap().chars().take(90).collect();
            let how =
                format!("{} by {} at risk {:.3}", d["action"], d["tier"], d["risk_score"].as_f64().unwrap_or(f64::NAN));
            eprintln!("miss [{}] {how}: {text:?}", row["kind"].as_str().unwrap());
        }
    }
    let mut total = [0usize; 4];
    eprintln!("{file}");
    eprintln!("{:<18} {:>4} {:>9} {:>13} {:>11}", "kind", "n", "accuracy", "risk allowed", "ok blocked");
    for (kind, t) in &by_kind {
        eprintln!("{kind:<18} {:>4} {:>9.3} {:>13} {:>11}", t[0], t[1] as f64 / t[0] as f64, t[2], t[3]);
        (0..4).for_each(|i| total[i] += t[i]);
    }
    let accuracy = total[1] as f64 / total[0] as f64;
    eprintln!("{:<18} {:>4} {accuracy:>9.3} {:>13} {:>11}", "all", total[0], total[2], total[3]);
    total
}
