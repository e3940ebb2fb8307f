//! The report's plots as inline SVG (plotters, through `tiergate::plot`), each `None` when there
//! is nothing to draw (the page says so instead).

use super::rates::Row;
use super::Report;
use tiergate::plot::quality::{
    confusion_svg, distance_svg, pr_curve_svg, review_load_svg, ConfusionPanel, PrMark, Series,
};
use tiergate::plot::{reliability_svg_string, ReliabilityCurve};

/// Confusion panels past this many groups (by labels) are left out of the plot (not the tables).
const MAX_PANELS: usize = 12;

/// The drift distance operators alert on (as `tiergate drift` and deploy/prometheus/alerts.yml).
pub const KS_ALERT: f64 = crate::cli::drift::KS_ALERT;

/// Every plot of the page.
pub struct Figures {
    pub reliability: Option<String>,
    pub pr: Option<String>,
    pub by_kind: Option<String>,
    pub by_lang: Option<String>,
    pub review_load: Option<String>,
    pub drift: Option<String>,
}

/// Draws the plots of `report`. Errors: plotters failed (naming the plot).
pub fn draw(report: &Report) -> anyhow::Result<Figures> {
    Ok(Figures {
        reliability: reliability(report)?,
        pr: pr(report)?,
        by_kind: confusion("Action × truth by record kind", report.rates.get("kind"))?,
        by_lang: confusion("Action × truth by language", report.rates.get("lang"))?,
        review_load: review_load(report)?,
        drift: drift(report)?,
    })
}

fn reliability(report: &Report) -> anyhow::Result<Option<String>> {
    let c = &report.calibration;
    let Some(ece) = c.ece else { return Ok(None) };
    let curve = ReliabilityCurve { name: format!("model tiers: ECE {ece:.3}, n = {}", c.decisions), bins: &c.bins };
    reliability_svg_string("Reliability of labelled model-tier decisions", &[curve]).map(Some)
}

fn pr(report: &Report) -> anyhow::Result<Option<String>> {
    let pr = &report.pr;
    if pr.points.is_empty() {
        return Ok(None);
    }
    let points: Vec<(f64, f64)> = pr.points.iter().map(|p| (p.recall, p.precision)).collect();
    let marks: Vec<PrMark> = pr
        .at
        .iter()
        .filter(|a| a.scope == "all")
        .filter_map(|a| {
            let name = format!("{} {:.2}", a.name, a.threshold);
            // A threshold nothing reaches has no precision: it sits at recall 0.
            Some(PrMark { name, recall: a.recall?, precision: a.precision.unwrap_or(1.0) })
        })
        .collect();
    let title = format!("Precision/recall over the risk score (n = {}, risk {})", pr.decisions, pr.risk);
    pr_curve_svg(&title, &points, &marks).map(Some)
}

fn confusion(title: &str, rows: Option<&Vec<Row>>) -> anyhow::Result<Option<String>> {
    let rows = rows.map(Vec::as_slice).unwrap_or_default();
    if rows.is_empty() {
        return Ok(None);
    }
    let panels: Vec<ConfusionPanel> = rows
        .iter()
        .take(MAX_PANELS)
        .map(|row| {
            let actions = super::ACTIONS.iter().filter(|a| **a != "unscreened" || row.actions.contains_key(**a));
            ConfusionPanel {
                name: row.value.clone(),
                rows: actions.map(|a| (a.to_string(), [row.cell(a).risk, row.cell(a).ok])).collect(),
            }
        })
        .collect();
    confusion_svg(title, &panels).map(Some)
}

fn review_load(report: &Report) -> anyhow::Result<Option<String>> {
    if report.summary.decisions == 0 {
        return Ok(None);
    }
    let names = super::bucket_names(report);
    let reviews: Vec<u64> = report.timeline.iter().map(|b| b.reviews).collect();
    let share: Vec<Option<f64>> =
        report.timeline.iter().map(|b| (b.reviews > 0).then(|| b.reviews_labelled as f64 / b.reviews as f64)).collect();
    review_load_svg(&names, &reviews, &share).map(Some)
}

fn drift(report: &Report) -> anyhow::Result<Option<String>> {
    if report.timeline.iter().all(|b| b.drift.is_none()) {
        return Ok(None);
    }
    let names = super::bucket_names(report);
    let series = |name: &str, pick: fn(&super::timeline::Drift) -> Option<f64>| Series {
        name: name.to_string(),
        values: report.timeline.iter().map(|b| b.drift.as_ref().and_then(pick)).collect(),
    };
    let lines = [
        series("risk score (KS)", |d| d.risk_score),
        series("OOD score (KS)", |d| d.ood_score),
        series("text length (KS)", |d| d.text_chars),
        series("language (TVD)", |d| d.language),
    ];
    distance_svg("Drift from the model's reference", &names, &lines, KS_ALERT).map(Some)
}
