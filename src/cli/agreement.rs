//! `tiergate model agreement LOG`: agreement figures of a shadow model (`[shadow.model]`) with
//! the live one, from the shadow log's `"kind": "model"` lines, before the candidate decides.
//!
//! - against the live cpu tier's verdict, where it gave one: agreement, Cohen's kappa (Cohen
//!   1960: agreement beyond what the two label rates give by chance) and the two kinds of
//!   disagreement;
//! - against the live decision's label where the live cpu tier gave none (a language it does not
//!   read, a shed): what the candidate would add;
//! - the same by language.
//!
//! Lines of other kinds (the shadow policy's disagreements) are skipped; a line that does not
//! parse is an error naming its line number.

use anyhow::Context as _;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Reads the `"kind": "model"` lines of a shadow log (other lines are skipped). A label is `risk`
/// when the calibrated risk score is at least 0.5. One table per candidate model in the log:
///
///   vs cpu     requests the live cpu tier gave a verdict on
///   agree      share of those where the candidate gave the same label
///   kappa      Cohen's kappa of the same pairs (agreement beyond chance; `-` when undefined)
///   cand+risk  candidate risk where the live model said ok
///   cand-risk  candidate ok where the live model said risk
///   no cpu     requests without a live cpu verdict (a language it does not read, unread text, shed)
///   cand risk  of those, the candidate's risk labels
///
/// --json prints, per candidate, `all` and `by_lang`, each with `vs_cpu` and
/// `vs_decision_without_cpu`: `counts[live][candidate]` (0 = ok, 1 = risk), `n`, `agreement`, `kappa`.
#[derive(clap::Args)]
pub struct AgreementArgs {
    /// The shadow log (`[shadow] log`), JSON lines.
    pub log: PathBuf,
    /// Print the figures as one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Counts of label pairs: `[live][candidate]`, index 0 = ok, 1 = risk.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Pairs(pub [[u64; 2]; 2]);

impl serde::Serialize for Pairs {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serde_json::json!({"counts": self.0, "n": self.n(), "agreement": self.agreement(), "kappa": self.kappa()})
            .serialize(s)
    }
}

impl Pairs {
    fn add(&mut self, live: bool, candidate: bool) {
        self.0[live as usize][candidate as usize] += 1;
    }

    pub fn n(&self) -> u64 {
        self.0.iter().flatten().sum()
    }

    /// Share of pairs with the same label; `None` when empty.
    pub fn agreement(&self) -> Option<f64> {
        let n = self.n();
        (n > 0).then(|| (self.0[0][0] + self.0[1][1]) as f64 / n as f64)
    }

    /// Cohen's kappa, (p_o - p_e) / (1 - p_e) with p_e from the two label rates; `None` when
    /// empty or when both raters give one label only (kappa is undefined there).
    pub fn kappa(&self) -> Option<f64> {
        let n = self.n() as f64;
        let po = self.agreement()?;
        let live_risk = (self.0[1][0] + self.0[1][1]) as f64 / n;
        let cand_risk = (self.0[0][1] + self.0[1][1]) as f64 / n;
        let pe = live_risk * cand_risk + (1.0 - live_risk) * (1.0 - cand_risk);
        (pe < 1.0).then(|| (po - pe) / (1.0 - pe))
    }
}

/// The figures of one group of lines (all, or one language).
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Group {
    /// Against the live cpu verdict, where there was one.
    pub vs_cpu: Pairs,
    /// Against the live decision's label, where the live cpu tier gave no verdict.
    pub vs_decision_without_cpu: Pairs,
}

#[derive(Debug, Default, serde::Serialize)]
pub struct Report {
    pub all: Group,
    pub by_lang: BTreeMap<String, Group>,
}

/// Reads the model lines of a shadow log into one [`Report`] per candidate model (a log may span
/// a change of candidate; pooling two would mean nothing). Errors: a line that is not JSON, or a
/// model line whose `candidate.label` (or, without a live cpu verdict, `live.label`) is not `risk`
/// or `ok`, naming its 1-based line number.
pub fn report(log: &str) -> anyhow::Result<BTreeMap<String, Report>> {
    let mut by_model: BTreeMap<String, Report> = BTreeMap::new();
    for (i, line) in log.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).with_context(|| format!("line {}: not JSON", i + 1))?;
        if v["kind"] != "model" {
            continue;
        }
        let is_risk = |x: &serde_json::Value, what: &str| match x.as_str() {
            Some("risk") => Ok(true),
            Some("ok") => Ok(false),
            _ => anyhow::bail!("line {}: {what} is {x}, not \"risk\" or \"ok\"", i + 1),
        };
        let candidate = is_risk(&v["candidate"]["label"], "candidate.label")?;
        let live_cpu = match &v["live"]["cpu"] {
            serde_json::Value::Null => None,
            cpu => Some(is_risk(&cpu["label"], "live.cpu.label")?),
        };
        let live = match live_cpu {
            Some(_) => None,
            None => Some(is_risk(&v["live"]["label"], "live.label")?),
        };
        let lang: String = v["lang"].as_str().unwrap_or("").chars().filter(|c| !c.is_control()).take(16).collect();
        let lang = if lang.is_empty() { "und".to_string() } else { lang };
        let model = v["candidate"]["model"].as_str().unwrap_or("?").to_string();
        let r = by_model.entry(model).or_default();
        let group = r.by_lang.entry(lang).or_default();
        for g in [&mut r.all, group] {
            match (live_cpu, live) {
                (Some(cpu), _) => g.vs_cpu.add(cpu, candidate),
                (None, Some(live)) => g.vs_decision_without_cpu.add(live, candidate),
                (None, None) => unreachable!("one of the two is read above"),
            }
        }
    }
    Ok(by_model)
}

pub fn run(args: &AgreementArgs) -> anyhow::Result<()> {
    use std::fmt::Write as _;
    let text = std::fs::read_to_string(&args.log).with_context(|| format!("reading {}", args.log.display()))?;
    let reports = report(&text)?;
    anyhow::ensure!(!reports.is_empty(), "no shadow model lines (\"kind\": \"model\") in {}", args.log.display());
    let mut out = String::new();
    if args.json {
        out = serde_json::to_string_pretty(&reports)? + "\n";
    }
    for (model, r) in reports.iter().filter(|_| !args.json) {
        let _ = writeln!(out, "candidate: {model}");
        let _ = writeln!(
            out,
            "{:<8} {:>7} {:>9} {:>7} {:>9} {:>9} {:>9} {:>11}",
            "lang", "vs cpu", "agree", "kappa", "cand+risk", "cand-risk", "no cpu", "cand risk"
        );
        for (name, g) in std::iter::once(("all", &r.all)).chain(r.by_lang.iter().map(|(l, g)| (l.as_str(), g))) {
            let f = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.3}"));
            let (c, d) = (&g.vs_cpu.0, &g.vs_decision_without_cpu.0);
            let _ = writeln!(
                out,
                "{:<8} {:>7} {:>9} {:>7} {:>9} {:>9} {:>9} {:>11}",
                name,
                g.vs_cpu.n(),
                f(g.vs_cpu.agreement()),
                f(g.vs_cpu.kappa()),
                c[0][1],
                c[1][0],
                g.vs_decision_without_cpu.n(),
                d[0][1] + d[1][1],
            );
        }
        let _ = writeln!(out);
    }
    if !args.json {
        out.push_str("columns: tiergate model agreement --help\n");
    }
    // A closed pipe (`| head`) ends the output quietly.
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(out.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(lang: &str, live: &str, cpu: Option<&str>, cand: &str) -> String {
        let cpu = cpu.map(|c| serde_json::json!({"label": c, "risk_score": 0.5}));
        serde_json::json!({"kind": "model", "lang": lang, "live": {"label": live, "cpu": cpu},
                           "candidate": {"label": cand, "model": "m"}})
        .to_string()
    }

    #[test]
    fn counts_agreement_and_kappa_by_language() {
        let log = [
            line("eng", "risk", Some("risk"), "risk"),
            line("eng", "ok", Some("ok"), "ok"),
            line("eng", "ok", Some("ok"), "risk"),
            line("eng", "ok", Some("ok"), "ok"),
            line("cmn", "ok", None, "risk"),
            r#"{"disagree": ["label"], "live": {}, "candidate": {}}"#.to_string(),
        ]
        .join("\n");
        let reports = report(&log).unwrap();
        assert_eq!(reports.keys().collect::<Vec<_>>(), vec!["m"]);
        let r = &reports["m"];
        assert_eq!(r.all.vs_cpu.n(), 4);
        assert_eq!(r.all.vs_cpu.agreement(), Some(0.75));
        // p_o = 0.75; live risk 1/4, candidate risk 2/4: p_e = 0.25*0.5 + 0.75*0.5 = 0.5.
        assert!((r.all.vs_cpu.kappa().unwrap() - 0.5).abs() < 1e-12);
        assert_eq!(r.all.vs_decision_without_cpu.0, [[0, 1], [0, 0]]);
        assert_eq!(r.by_lang["cmn"].vs_cpu.n(), 0);
        assert_eq!(r.by_lang["eng"].vs_cpu.0, [[2, 1], [0, 1]]);
    }

    #[test]
    fn each_candidate_gets_its_own_figures() {
        let other = line("eng", "ok", Some("ok"), "risk").replace("\"model\":\"m\"", "\"model\":\"n\"");
        let r = report(&[line("eng", "ok", Some("ok"), "ok"), other].join("\n")).unwrap();
        assert_eq!(r["m"].all.vs_cpu.agreement(), Some(1.0));
        assert_eq!(r["n"].all.vs_cpu.agreement(), Some(0.0));
    }

    #[test]
    fn kappa_is_undefined_when_both_give_one_label() {
        let r = report(&[line("eng", "ok", Some("ok"), "ok"), line("eng", "ok", Some("ok"), "ok")].join("\n")).unwrap();
        assert_eq!(r["m"].all.vs_cpu.agreement(), Some(1.0));
        assert_eq!(r["m"].all.vs_cpu.kappa(), None);
    }

    #[test]
    fn a_bad_line_is_named() {
        let e = report("{\"kind\": \"model\"}\nnot json").unwrap_err();
        assert!(format!("{e:#}").contains("line 1: candidate.label is null"), "{e:#}");
        let e = report(&line("eng", "ok", Some("maybe"), "risk")).unwrap_err();
        assert!(format!("{e:#}").contains("line 1: live.cpu.label is \"maybe\""), "{e:#}");
        let e = report("\nnot json").unwrap_err();
        assert!(format!("{e:#}").contains("line 2: not JSON"), "{e:#}");
    }
}
