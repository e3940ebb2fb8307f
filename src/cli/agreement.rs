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

#[derive(clap::Args)]
pub struct AgreementArgs {
    /// The shadow log (`[shadow] log`), JSON lines.
    pub log: PathBuf,
    /// Print the figures as one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Counts of label pairs: `[live][candidate]`, index 0 = ok, 1 = risk.
#[derive(Debug, Default, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Pairs(pub [[u64; 2]; 2]);

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
    /// Candidate models seen in the log (a log may span a change of candidate).
    pub models: Vec<String>,
}

/// Reads the model lines of a shadow log. Errors: a line that is not JSON, or a model line
/// without `live.label` / `candidate.label`, naming its 1-based line number.
pub fn report(log: &str) -> anyhow::Result<Report> {
    let mut r = Report::default();
    for (i, line) in log.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).with_context(|| format!("line {}: not JSON", i + 1))?;
        if v["kind"] != "model" {
            continue;
        }
        let is_risk = |x: &serde_json::Value, what: &str| {
            x.as_str().map(|s| s == "risk").with_context(|| format!("line {}: no {what}", i + 1))
        };
        let candidate = is_risk(&v["candidate"]["label"], "candidate.label")?;
        let lang = v["lang"].as_str().filter(|l| !l.is_empty()).unwrap_or("und").to_string();
        let model = v["candidate"]["model"].as_str().unwrap_or("?");
        if !r.models.iter().any(|m| m == model) {
            r.models.push(model.to_string());
        }
        let group = r.by_lang.entry(lang).or_default();
        for g in [&mut r.all, group] {
            match v["live"]["cpu"]["label"].as_str() {
                Some(cpu) => g.vs_cpu.add(cpu == "risk", candidate),
                None => g.vs_decision_without_cpu.add(is_risk(&v["live"]["label"], "live.label")?, candidate),
            }
        }
    }
    Ok(r)
}

pub fn run(args: &AgreementArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.log).with_context(|| format!("reading {}", args.log.display()))?;
    let r = report(&text)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    anyhow::ensure!(
        r.all.vs_cpu.n() + r.all.vs_decision_without_cpu.n() > 0,
        "no shadow model lines in {}",
        args.log.display()
    );
    println!("candidate: {}", r.models.join(", "));
    println!(
        "{:<8} {:>7} {:>9} {:>7} {:>9} {:>9} {:>9} {:>11}",
        "lang", "vs cpu", "agree", "kappa", "cand+risk", "cand-risk", "no cpu", "cand risk"
    );
    let row = |name: &str, g: &Group| {
        let f = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.3}"));
        let c = &g.vs_cpu.0;
        let d = &g.vs_decision_without_cpu.0;
        println!(
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
    };
    row("all", &r.all);
    for (lang, g) in &r.by_lang {
        row(lang, g);
    }
    println!("vs cpu: requests the live cpu tier scored; cand+risk / cand-risk: the candidate says risk where the live model said ok / the reverse;");
    println!("no cpu: requests the live cpu tier gave no verdict (other languages, shed); cand risk: of those, the candidate's risk labels.");
    Ok(())
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
        let r = report(&log).unwrap();
        assert_eq!(r.all.vs_cpu.n(), 4);
        assert_eq!(r.all.vs_cpu.agreement(), Some(0.75));
        // p_o = 0.75; live risk 1/4, candidate risk 2/4: p_e = 0.25*0.5 + 0.75*0.5 = 0.5.
        assert!((r.all.vs_cpu.kappa().unwrap() - 0.5).abs() < 1e-12);
        assert_eq!(r.all.vs_decision_without_cpu.0, [[0, 1], [0, 0]]);
        assert_eq!(r.by_lang["cmn"].vs_cpu.n(), 0);
        assert_eq!(r.by_lang["eng"].vs_cpu.0, [[2, 1], [0, 1]]);
        assert_eq!(r.models, vec!["m"]);
    }

    #[test]
    fn kappa_is_undefined_when_both_give_one_label() {
        let r = report(&[line("eng", "ok", Some("ok"), "ok"), line("eng", "ok", Some("ok"), "ok")].join("\n")).unwrap();
        assert_eq!(r.all.vs_cpu.agreement(), Some(1.0));
        assert_eq!(r.all.vs_cpu.kappa(), None);
    }

    #[test]
    fn a_bad_line_is_named() {
        let e = report("{\"kind\": \"model\"}\nnot json").unwrap_err();
        assert!(format!("{e:#}").contains("line 1: no candidate.label"), "{e:#}");
        let e = report("\nnot json").unwrap_err();
        assert!(format!("{e:#}").contains("line 2: not JSON"), "{e:#}");
    }
}
