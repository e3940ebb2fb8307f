//! What `tiergate tune` says: the proposal and its held-out rates as Markdown (printed, and the
//! head of the candidate's `TUNE.md`), and the values the candidate changes.

use super::fit::{Judgement, Rates, GRID_STEP};
use super::write::Change;
use super::{Args, GroupFit, Input, Skipped, TemperatureFit};
use std::fmt::Write as _;

/// A group as the report names it.
pub fn group_name(scenario: Option<&str>) -> String {
    scenario.map_or_else(|| "[actions] (no scenario)".to_string(), |s| format!("[scenarios.{s}]"))
}

fn judged(j: &Judgement) -> String {
    match j {
        Judgement::Improves(why) => format!("better: {why}"),
        Judgement::Unchanged => "unchanged".into(),
        Judgement::Worse(why) => format!("NOT better: {why}"),
    }
}

fn arrow(before: f64, after: f64) -> String {
    if before == after {
        format!("{before}")
    } else {
        format!("{before} → **{after}**")
    }
}

/// The proposal in Markdown: what was read, the temperature, each group's thresholds with its
/// judgement, the expected rates on the held-out decisions, and what could not be fitted.
pub fn summary(
    args: &Args,
    input: &Input,
    temperature: Option<&TemperatureFit>,
    groups: &[GroupFit],
    skipped: &Skipped,
) -> String {
    let mut s = String::from("## Proposal\n\n");
    let until = args.until.as_deref().unwrap_or("now");
    let _ = writeln!(s, "Labelled decisions from `{}` to `{until}`: {}.", args.since, input.counts.join("; "));
    let from = match input.policy.calibration.cpu_temperature {
        Some(_) => format!("the policy's; the model's own is {}", input.model_t),
        None => "the model's own".into(),
    };
    let _ = writeln!(
        s,
        "Live policy `{}` (version {}); cpu scores served at temperature {} ({from}). \
         Fitted on one split, judged on the held-out {} of the decisions (by record id, seed {}); thresholds \
         on a grid of {GRID_STEP}; false-block budget {}.\n",
        input.policy_dir.display(),
        input.policy.version,
        input.current_t,
        args.holdout,
        args.seed,
        args.max_false_block
    );
    s += "| value | current → proposed | on the held-out decisions |\n|---|---|---|\n";
    if let Some(t) = temperature {
        let _ = writeln!(
            s,
            "| `[calibration] cpu_temperature` | {} | {} ({} / {} cpu decisions fit / held out) |",
            arrow(t.current, t.proposed),
            judged(&t.judgement),
            t.n.0,
            t.n.1
        );
    }
    for g in groups {
        let name = group_name(g.scenario.as_deref());
        let _ = writeln!(
            s,
            "| {name} `block_at` | {} | {} ({} / {} decisions fit / held out) |",
            arrow(g.current.block_at, g.proposed.block_at),
            judged(&g.block),
            g.n.0,
            g.n.1
        );
        let (a, b) = (g.current.review_at, g.proposed.review_at);
        let _ = writeln!(s, "| {name} `review_at` | {} | {} |", arrow(a, b), judged(&g.review));
    }
    s += &rates_table(groups);
    if !skipped.is_empty() {
        s += "\n### Not fitted (too few labels)\n\n";
        for line in skipped {
            let _ = writeln!(s, "- {line}");
        }
    }
    s
}

/// The expected rates, current and proposed, on each group's held-out decisions.
fn rates_table(groups: &[GroupFit]) -> String {
    if groups.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "\n### Expected rates on the held-out decisions (current → proposed)\n\n\
         Over the labelled decisions a model tier made (the ones thresholds apply to). False-block rate: \
         ok-labelled blocked / ok-labelled; block precision: risk among blocked; block recall: risk blocked / \
         risk; risk allowed: risk-labelled allowed / risk-labelled; review share: in review / all.\n\n\
         | group | decisions (ok / risk) | block precision | false-block rate | block recall | risk allowed | review share |\n\
         |---|---|---|---|---|---|---|\n",
    );
    let pair = |f: fn(&Rates) -> f64, g: &GroupFit| format!("{:.4} → {:.4}", f(&g.before), f(&g.after));
    for g in groups {
        let precision = |r: &Rates| r.block_precision.map_or("n/a".to_string(), |p| format!("{p:.4}"));
        let _ = writeln!(
            s,
            "| {} | {} ({} / {}) | {} → {} | {} | {} | {} | {} |",
            group_name(g.scenario.as_deref()),
            g.before.rows,
            g.before.ok,
            g.before.risk,
            precision(&g.before),
            precision(&g.after),
            pair(|r| r.false_block_rate, g),
            pair(|r| r.block_recall, g),
            pair(|r| r.risk_allowed_rate, g),
            pair(|r| r.review_share, g),
        );
    }
    s
}

/// The values the candidate changes: the better temperature and thresholds; and a scenario that
/// inherited a changed `[actions]` value keeps its own, written out.
pub fn changes(input: &Input, temperature: Option<&TemperatureFit>, groups: &[GroupFit]) -> Vec<Change> {
    let change =
        |table: &[&str], key, value| Change { table: table.iter().map(|s| s.to_string()).collect(), key, value };
    let mut out = Vec::new();
    if let Some(t) = temperature.filter(|t| matches!(t.judgement, Judgement::Improves(_))) {
        out.push(change(&["calibration"], "cpu_temperature", t.proposed));
    }
    for g in groups {
        let table: Vec<&str> = match &g.scenario {
            None => vec!["actions"],
            Some(s) => vec!["scenarios", s.as_str()],
        };
        if g.proposed.block_at != g.current.block_at {
            out.push(change(&table, "block_at", g.proposed.block_at));
        }
        if g.proposed.review_at != g.current.review_at {
            out.push(change(&table, "review_at", g.proposed.review_at));
        }
    }
    let defaults: Vec<&'static str> = out.iter().filter(|c| c.table == ["actions"]).map(|c| c.key).collect::<Vec<_>>();
    for (name, scenario) in &input.policy.scenarios {
        for key in &defaults {
            let own = out.iter().any(|c| c.key == *key && c.table.len() == 2 && c.table[1] == *name);
            if !own {
                let a = &scenario.actions;
                out.push(change(&["scenarios", name], key, if *key == "block_at" { a.block_at } else { a.review_at }));
            }
        }
    }
    out
}

/// The candidate's `TUNE.md`: how it was made, the proposal, the diff, and what to do next.
pub fn tune_md(args: &Args, summary: &str, diff: &str, version: &str) -> String {
    let command: Vec<String> = std::env::args().map(|a| if a.contains(' ') { format!("'{a}'") } else { a }).collect();
    let out = args.out.display();
    format!(
        "# Candidate policy `{version}` from `tiergate tune`\n\n\
         Written by `{}` at {}.\n\n{summary}\n\
         ## Diff against the live policy\n\n```diff\n{diff}```\n\n\
         ## Next (docs/operations.md, \"Feedback loop\")\n\n\
         1. `tiergate check-policy {out}` (and `--against` a labelled set to replay it).\n\
         2. Try it on live traffic: `[ab] dir = \"{out}\"` with a `share`, then watch \
         `GET /admin/policy` (`ab`) and `tiergate_ab_*`; it rolls back by itself when its block, fallback \
         or error rate leaves its band.\n\
         3. Promote: copy its `*.toml` into the live policy directory and `POST /admin/reload`; \
         remove `[ab] dir`.\n",
        command.join(" "),
        chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    )
}
