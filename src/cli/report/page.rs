//! The report as one self-contained HTML page: inline CSS, the plots as inline SVG, no script and
//! no external asset; every number also in a `<script type="application/json" id="report-data">`
//! block (the [`Report`] as JSON) for tools and tests. Every string from the store is escaped.

use super::figures::Figures;
use super::rates::Row;
use super::{time_text, Report};
use std::fmt::Write as _;

const STYLE: &str = "
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:1180px;color:#1d232a;padding:0 16px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:19px;margin:32px 0 8px;border-bottom:1px solid #d5dbe1;padding-bottom:4px}
h3{font-size:15px;margin:20px 0 6px}.meta{color:#56606b;margin:0 0 12px}
table{border-collapse:collapse;margin:6px 0 14px;font-variant-numeric:tabular-nums}
th,td{border:1px solid #d5dbe1;padding:4px 8px;text-align:right;vertical-align:top}
th{background:#f3f5f7;font-weight:600}th small{display:block;font-weight:400;color:#56606b;font-size:11px}
td:first-child,th:first-child{text-align:left}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:8px 0}
.card{border:1px solid #d5dbe1;border-radius:6px;padding:8px 14px;min-width:130px}
.card b{display:block;font-size:22px}.card span{color:#56606b;font-size:12px}
.empty{background:#fff7e0;border:1px solid #f0d58a;border-radius:6px;padding:10px 14px}
figure{margin:14px 0 24px}figcaption{color:#3b444d;max-width:900px;margin-top:4px}
figure svg{max-width:100%;height:auto;border:1px solid #e3e7eb}
dl.rates dt{font-weight:600;margin-top:6px}dl.rates dd{margin:0 0 0 18px;color:#3b444d}
";

fn esc(s: &str) -> std::borrow::Cow<'_, str> {
    html_escape::encode_text(s)
}

fn rate(r: Option<f64>) -> String {
    r.map_or_else(|| "–".to_string(), |r| format!("{:.1} %", 100.0 * r))
}

/// The page of `report` with its `figures`.
pub fn render(report: &Report, figures: &Figures) -> String {
    let mut out = String::with_capacity(256 * 1024);
    let window = format!("{} to {}", time_text(report.since_ms), time_text(report.until_ms));
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>tiergate feedback report, {}</title><style>{STYLE}</style></head><body>\n",
        esc(&window)
    );
    header(&mut out, report, &window);
    summary(&mut out, report);
    rates(&mut out, report);
    plots(&mut out, report, figures);
    data(&mut out, report);
    out.push_str("</body></html>\n");
    out
}

fn header(out: &mut String, report: &Report, window: &str) {
    let _ = write!(out, "<h1>tiergate feedback report</h1><p class=\"meta\">Decisions made {}", esc(window));
    let _ = write!(out, " (by {}) · store <code>{}</code>", report.bucket, esc(&report.store));
    match &report.thresholds {
        Some(t) => {
            let _ = write!(
                out,
                " · policy <code>{}</code> version {}: review_at {}, block_at {}",
                esc(&t.dir),
                esc(&t.version),
                t.review_at,
                t.block_at
            );
        }
        None => out.push_str(" · no policy given (--policy-dir or --config): thresholds are not marked"),
    }
    let _ = writeln!(out, " · generated {}</p>", time_text(report.generated_ms));
}

fn card(out: &mut String, id: &str, value: impl std::fmt::Display, what: &str) {
    let _ = write!(out, "<div class=\"card\" id=\"{id}\"><b>{value}</b><span>{}</span></div>", esc(what));
}

fn summary(out: &mut String, report: &Report) {
    let s = &report.summary;
    out.push_str("<h2>Summary</h2>\n");
    if s.labelled == 0 {
        out.push_str(
            "<p class=\"empty\" id=\"nothing-labelled\">Nothing labelled in this window: no label \
             (<code>POST /v1/feedback</code>) names a decision made in it, so there are no quality rates \
             and no model plots. Decision counts, review load and drift are below.</p>\n",
        );
    }
    out.push_str("<div class=\"cards\">");
    card(out, "decisions", s.decisions, "decisions in the window (shadow records left out)");
    card(out, "reviews", s.by_action.get("review").copied().unwrap_or(0), "decisions sent to review");
    card(out, "labelled", s.labelled, "decisions labelled (one truth each)");
    card(out, "labelled-risk", s.labelled_truth.risk, "labelled risk");
    card(out, "labelled-ok", s.labelled_truth.ok, "labelled ok");
    card(out, "labels", s.labels, "labels (one per decision and source)");
    card(out, "reviewers", s.reviewers, "reviewers who labelled");
    let ece = report.calibration.ece.map_or_else(|| "–".to_string(), |e| format!("{e:.3}"));
    card(out, "ece", ece, &format!("model-tier ECE ({} labelled)", report.calibration.decisions));
    out.push_str("</div>\n");
    counts_table(out, "Decisions by kind", "kind", &s.by_kind);
    counts_table(out, "Decisions by action", "action", &s.by_action);
    let sources: Vec<(String, String)> = s
        .labels_by_source
        .iter()
        .map(|(k, t)| (k.clone(), format!("{}</td><td>{}</td><td>{}", t.total(), t.risk, t.ok)))
        .collect();
    out.push_str("<h3>Labels by source</h3><table id=\"labels-by-source\"><tr><th>source</th><th>labels</th>");
    out.push_str("<th>risk</th><th>ok</th></tr>");
    for (source, cells) in &sources {
        let _ = write!(out, "<tr><td>{}</td><td>{cells}</td></tr>", esc(source));
    }
    out.push_str("</table>\n<p>A decision labelled by several sources counts once in the rates: a chargeback's label over an analyst's, an analyst's over any other source's.</p>\n");
}

fn counts_table(out: &mut String, title: &str, what: &str, counts: &std::collections::BTreeMap<String, u64>) {
    let _ = write!(out, "<h3>{title}</h3><table><tr><th>{what}</th><th>decisions</th></tr>");
    for (k, n) in counts {
        let _ = write!(out, "<tr><td>{}</td><td>{n}</td></tr>", esc(k));
    }
    out.push_str("</table>\n");
}

/// The dimensions' tables, in page order: (key, heading, what a row is).
const DIMENSIONS: [(&str, &str, &str); 10] = [
    ("tier", "By deciding tier", "tier"),
    ("rule", "By deciding rule or guard", "rule (none: a model decided)"),
    ("scenario", "By scenario", "scenario"),
    ("lang", "By language", "language (ISO 639-3)"),
    ("kind", "By record kind", "kind"),
    ("tenant", "By tenant", "tenant"),
    ("tenant_class", "By tenant class", "class"),
    ("policy_version", "By policy version (an [ab] candidate's decisions carry its own)", "version"),
    ("source", "By label source (every label)", "source"),
    ("reviewer", "By reviewer (every label)", "reviewer"),
];

fn rates(out: &mut String, report: &Report) {
    out.push_str(
        "<h2>Quality by dimension</h2><dl class=\"rates\">\
         <dt>block precision</dt><dd>of the blocked decisions, the share labelled risk (blocked ∧ risk ÷ blocked)</dd>\
         <dt>false-block rate</dt><dd>of the decisions labelled ok, the share blocked (blocked ∧ ok ÷ ok)</dd>\
         <dt>risk-allowed rate</dt><dd>of the decisions labelled risk, the share allowed (allowed ∧ risk ÷ risk)</dd>\
         <dt>review precision</dt><dd>of the reviewed decisions, the share labelled risk (reviewed ∧ risk ÷ reviewed): \
         the share of the review queue's work that was risk</dd></dl>\
         <p>– : no decision in the rate's denominator. The per-source and per-reviewer tables count every label \
         (the labeller's own truth); the others count each labelled decision once.</p>\n",
    );
    for (key, heading, what) in DIMENSIONS {
        if let Some(rows) = report.rates.get(key) {
            let _ = write!(out, "<h3>{heading}</h3>");
            rates_table(out, key, what, rows);
        }
    }
}

fn rates_table(out: &mut String, key: &str, what: &str, rows: &[Row]) {
    let _ = write!(
        out,
        "<table id=\"rates-{key}\"><tr><th>{}</th><th>labelled</th><th>risk</th><th>ok</th>\
         <th>blocked<small>risk / ok</small></th><th>reviewed<small>risk / ok</small></th>\
         <th>allowed<small>risk / ok</small></th>\
         <th>block precision<small>blocked ∧ risk ÷ blocked</small></th>\
         <th>false-block rate<small>blocked ∧ ok ÷ ok</small></th>\
         <th>risk-allowed rate<small>allowed ∧ risk ÷ risk</small></th>\
         <th>review precision<small>reviewed ∧ risk ÷ reviewed</small></th></tr>",
        esc(what)
    );
    if rows.is_empty() {
        out.push_str("<tr><td colspan=\"11\">nothing labelled</td></tr>");
    }
    for r in rows {
        let (b, v, a) = (r.cell("block"), r.cell("review"), r.cell("allow"));
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} / {}</td><td>{} / {}</td><td>{} / {}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&r.value),
            r.labelled,
            r.truth.risk,
            r.truth.ok,
            b.risk,
            b.ok,
            v.risk,
            v.ok,
            a.risk,
            a.ok,
            rate(r.block_precision),
            rate(r.false_block_rate),
            rate(r.risk_allowed_rate),
            rate(r.review_precision)
        );
    }
    out.push_str("</table>\n");
}

fn figure(out: &mut String, id: &str, svg: Option<&String>, empty: &str, caption: &str) {
    match svg {
        Some(svg) => {
            let _ = writeln!(out, "<figure id=\"plot-{id}\">{svg}<figcaption>{caption}</figcaption></figure>");
        }
        None => {
            let _ = writeln!(
                out,
                "<figure id=\"plot-{id}\" data-empty=\"true\"><p class=\"empty\">{empty}</p>\
                 <figcaption>{caption}</figcaption></figure>"
            );
        }
    }
}

fn plots(out: &mut String, report: &Report, f: &Figures) {
    out.push_str("<h2>Model quality</h2>\n");
    figure(
        out,
        "reliability",
        f.reliability.as_ref(),
        "No labelled model-tier decision in this window.",
        "Each point is a bin of labelled cpu/gpu decisions by the predicted label's probability (max(p, 1 − p)): \
         its mean probability against how often that label was right. On the diagonal the model is calibrated; \
         below it, over-confident. ECE is the bins' gap weighted by their share (10 bins, as the \
         <code>tiergate_quality_model_ece</code> gauge).",
    );
    figure(
        out,
        "pr",
        f.pr.as_ref(),
        "No labelled model-tier decision labelled risk in this window.",
        "Flagging every model-tier decision scored at or above a threshold: recall (the share of the risk flagged) \
         against precision (the share of the flagged that was risk), thresholds falling from left to right. The \
         marked points are today's policy thresholds: review_at (flagged means at least reviewed) and block_at.",
    );
    thresholds_table(out, report);
    out.push_str("<h2>Confusion</h2>\n");
    figure(
        out,
        "confusion-kind",
        f.by_kind.as_ref(),
        "Nothing labelled in this window.",
        "Labelled decisions by their action (rows) and their truth (columns), one panel per record kind \
         (classify: <code>/v1/classify</code>; screen: a proxy route; stream_cut: a cut answer). Risk that was allowed \
         and ok that was blocked are the costly cells.",
    );
    figure(
        out,
        "confusion-lang",
        f.by_lang.as_ref(),
        "Nothing labelled in this window.",
        "The same per language of the text (ISO 639-3; und: not reliably detected), the most labelled first.",
    );
    out.push_str("<h2>Over time</h2>\n");
    figure(
        out,
        "review-load",
        f.review_load.as_ref(),
        "No decision in this window.",
        "Decisions sent to review per bucket (bars) and the share of them labelled so far (line): the review \
         queue's load and how much of it came back as feedback.",
    );
    let no_drift = match report.reference {
        Some(_) => "No scored decision in this window.",
        None => "No drift reference (--reference, or the config's model directory's reference.json).",
    };
    let rescored = report.drift_rescored.as_ref().map_or_else(String::new, |r| {
        format!(
            " Policy {}'s cpu scores are read at the model's temperature {} (not its own {}), as the live monitor \
             reads them: a policy's temperature moves the scores on purpose.",
            esc(&r.policy_version),
            r.model_temperature,
            r.policy_temperature
        )
    });
    let caption = format!(
        "Each bucket's decisions against the model's drift reference (the validation data it was calibrated on), \
         as the live drift monitor compares them: the two-sample Kolmogorov–Smirnov distance of the risk score, \
         the OOD score and the text length, and the total variation distance of the language shares. Above the \
         dashed line (0.1) traffic differs from the reference; small buckets read high by chance (see the \
         p-values in the data block).{rescored}"
    );
    figure(out, "drift", f.drift.as_ref(), no_drift, &caption);
}

fn thresholds_table(out: &mut String, report: &Report) {
    if report.pr.at.is_empty() {
        return;
    }
    out.push_str(
        "<table id=\"thresholds\"><tr><th>decisions</th><th>threshold</th><th>value</th><th>model-tier decisions</th>\
         <th>at or above<small>flagged</small></th><th>recall<small>flagged ∧ risk ÷ risk</small></th>\
         <th>precision<small>flagged ∧ risk ÷ flagged</small></th></tr>",
    );
    for a in &report.pr.at {
        let scope =
            if a.scope == "all" { "all (the policy's own thresholds)".into() } else { format!("scenario {}", a.scope) };
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&scope),
            a.name,
            a.threshold,
            a.decisions,
            a.flagged,
            rate(a.recall),
            rate(a.precision)
        );
    }
    out.push_str("</table>\n");
}

/// The report as JSON inside the page; `<`, `>` and `&` are written as JSON escapes so that no
/// string from the store can end the script element.
fn data(out: &mut String, report: &Report) {
    let json = serde_json::to_string(report).unwrap_or_else(|_| "{}".into());
    let json = json.replace('<', "\\u003c").replace('>', "\\u003e").replace('&', "\\u0026");
    let _ = writeln!(out, "<script type=\"application/json\" id=\"report-data\">{json}</script>");
}
