//! The feedback report's charts (`tiergate report`), each drawn by plotters into an SVG document
//! held in a string, for a page that inlines it: the precision/recall curve with the policy's
//! thresholds marked, confusion heatmaps (action × truth) per group, review load over time, and
//! drift distances over time.
//!
//! Categories (truths, actions, time buckets) sit on an f64 axis, one unit each, and are named by
//! text drawn under (or beside) the plot: plotters' discrete axes cannot hold a single category.

use super::plot_err;
use anyhow::Context as _;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// A point marked on the precision/recall curve: a threshold of today's policy.
#[derive(Debug, Clone, PartialEq)]
pub struct PrMark {
    /// Legend text, e.g. "review_at 0.30".
    pub name: String,
    pub recall: f64,
    pub precision: f64,
}

/// One panel of [`confusion_svg`]: a group's counts of decisions by action (rows, in order) and
/// truth (`[risk, ok]`).
#[derive(Debug, Clone, PartialEq)]
pub struct ConfusionPanel {
    pub name: String,
    pub rows: Vec<(String, [u64; 2])>,
}

/// One line of [`distance_svg`]: a value per time bucket (`None`: nothing to compare).
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub values: Vec<Option<f64>>,
}

const COLORS: [RGBColor; 4] = [RGBColor(31, 119, 180), RGBColor(214, 39, 40), RGBColor(44, 160, 44), MAGENTA];

/// Draws into a fresh string of `size` pixels with `draw`. Errors name `what`.
fn svg(what: &str, size: (u32, u32), draw: impl FnOnce(Area<'_>) -> anyhow::Result<()>) -> anyhow::Result<String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        draw(root.clone()).with_context(|| format!("drawing the {what}"))?;
        root.present().map_err(plot_err)?;
    }
    Ok(out)
}

fn style(size: u32) -> TextStyle<'static> {
    TextStyle::from(("sans-serif", size).into_font())
}

/// The precision/recall curve of `points` (recall, precision), thresholds descending, with
/// `marks` as labelled points.
pub fn pr_curve_svg(title: &str, points: &[(f64, f64)], marks: &[PrMark]) -> anyhow::Result<String> {
    svg("precision/recall curve", (560, 480), |root| {
        let mut c = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(48)
            .build_cartesian_2d(0f64..1f64, 0f64..1.02f64)
            .map_err(plot_err)?;
        c.configure_mesh()
            .light_line_style(TRANSPARENT)
            .x_desc("recall (share of risk scored at or above the threshold)")
            .y_desc("precision (share of those that were risk)")
            .draw()
            .map_err(plot_err)?;
        c.draw_series(LineSeries::new(points.iter().copied(), COLORS[0].stroke_width(2)))
            .map_err(plot_err)?
            .label("every threshold")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], COLORS[0].stroke_width(2)));
        // Rings, each smaller than the one before: thresholds that flag the same decisions sit on
        // one point of the curve and stay visible there.
        for (i, (mark, color)) in marks.iter().zip(COLORS.iter().skip(1).cycle()).enumerate() {
            let (at, radius) = ((mark.recall, mark.precision), 12u32.saturating_sub(4 * i as u32).max(4));
            c.draw_series([Circle::new(at, radius, color.stroke_width(3))])
                .map_err(plot_err)?
                .label(mark.name.clone())
                .legend(move |(x, y)| Circle::new((x + 9, y), 5, color.stroke_width(3)));
        }
        c.configure_series_labels()
            .position(SeriesLabelPosition::LowerLeft)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.85))
            .draw()
            .map_err(plot_err)?;
        Ok(())
    })
}

/// Heatmaps of action × truth, one per panel, four to a row; each cell holds its count and is
/// shaded by its share of the panel's decisions.
pub fn confusion_svg(title: &str, panels: &[ConfusionPanel]) -> anyhow::Result<String> {
    const PER_ROW: usize = 4;
    let rows = panels.len().div_ceil(PER_ROW).max(1);
    let columns = panels.len().clamp(1, PER_ROW);
    svg("confusion heatmaps", (250 * columns as u32, 40 + 230 * rows as u32), |root| {
        let root = root.titled(title, ("sans-serif", 18)).map_err(plot_err)?;
        for (area, panel) in root.split_evenly((rows, columns)).iter().zip(panels) {
            confusion_panel(area, panel)?;
        }
        Ok(())
    })
}

fn confusion_panel(area: &Area<'_>, panel: &ConfusionPanel) -> anyhow::Result<()> {
    let total: u64 = panel.rows.iter().flat_map(|(_, c)| c).sum();
    let n = panel.rows.len().max(1) as f64;
    let mut c = ChartBuilder::on(area)
        .caption(format!("{} (n = {total})", panel.name), ("sans-serif", 15))
        .margin(8)
        .margin_left(78)
        .x_label_area_size(24)
        .build_cartesian_2d(0f64..2f64, 0f64..n)
        .map_err(plot_err)?;
    c.configure_mesh().disable_mesh().disable_axes().draw().map_err(plot_err)?;
    let mut cells = Vec::new();
    for (i, (_, counts)) in panel.rows.iter().enumerate() {
        // The first action on top.
        let y = n - 1.0 - i as f64;
        for (x, &count) in counts.iter().enumerate() {
            let share = if total == 0 { 0.0 } else { count as f64 / total as f64 };
            let fill = RGBColor((255.0 - 200.0 * share) as u8, (255.0 - 140.0 * share) as u8, 255);
            cells.push((x as f64, y, count, fill, share > 0.55));
        }
    }
    c.draw_series(cells.iter().map(|&(x, y, _, fill, _)| Rectangle::new([(x, y), (x + 1.0, y + 1.0)], fill.filled())))
        .map_err(plot_err)?;
    c.draw_series(cells.iter().map(|&(x, y, _, _, _)| Rectangle::new([(x, y), (x + 1.0, y + 1.0)], BLACK.mix(0.3))))
        .map_err(plot_err)?;
    let centred = style(15).pos(Pos::new(HPos::Center, VPos::Center));
    c.draw_series(cells.iter().map(|&(x, y, count, _, dark)| {
        let color: &'static RGBColor = if dark { &WHITE } else { &BLACK };
        Text::new(count.to_string(), (x + 0.5, y + 0.5), centred.clone().color(color))
    }))
    .map_err(plot_err)?;
    let under = style(13).pos(Pos::new(HPos::Center, VPos::Top));
    c.draw_series(
        ["truth: risk", "truth: ok"].iter().enumerate().map(|(x, name)| {
            EmptyElement::at((x as f64 + 0.5, 0.0)) + Text::new(name.to_string(), (0, 6), under.clone())
        }),
    )
    .map_err(plot_err)?;
    let left = style(13).pos(Pos::new(HPos::Right, VPos::Center));
    c.draw_series(panel.rows.iter().enumerate().map(|(i, (action, _))| {
        EmptyElement::at((0.0, n - 0.5 - i as f64)) + Text::new(action.clone(), (-6, 0), left.clone())
    }))
    .map_err(plot_err)?;
    Ok(())
}

/// Every few of `names` (about a dozen at most), each at the centre of its bucket.
fn bucket_ticks(names: &[String]) -> Vec<(f64, String)> {
    let step = names.len().div_ceil(12).max(1);
    names.iter().enumerate().step_by(step).map(|(i, name)| (i as f64 + 0.5, name.clone())).collect()
}

/// Reviews per time bucket (bars, left axis) and the share of them labelled (line, right axis);
/// `buckets` names the buckets.
pub fn review_load_svg(buckets: &[String], reviews: &[u64], labelled_share: &[Option<f64>]) -> anyhow::Result<String> {
    svg("review load chart", (760, 400), |root| {
        let n = buckets.len().max(1) as f64;
        let top = reviews.iter().copied().max().unwrap_or(0).max(1) as f64 * 1.1;
        let mut c = ChartBuilder::on(&root)
            .caption("Review load", ("sans-serif", 18))
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(48)
            .right_y_label_area_size(48)
            .build_cartesian_2d(0f64..n, 0f64..top)
            .map_err(plot_err)?
            .set_secondary_coord(0f64..n, 0f64..1.02f64);
        c.configure_mesh()
            .disable_x_mesh()
            .disable_x_axis()
            .light_line_style(TRANSPARENT)
            .y_desc("decisions reviewed")
            .draw()
            .map_err(plot_err)?;
        c.configure_secondary_axes().y_desc("share of reviews labelled").draw().map_err(plot_err)?;
        let bars = reviews.iter().enumerate().map(|(i, &r)| {
            Rectangle::new([(i as f64 + 0.15, 0.0), (i as f64 + 0.85, r as f64)], COLORS[0].mix(0.7).filled())
        });
        c.draw_series(bars)
            .map_err(plot_err)?
            .label("reviews")
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], COLORS[0].mix(0.7).filled()));
        let under = style(12).pos(Pos::new(HPos::Center, VPos::Top));
        let ticks = bucket_ticks(buckets).into_iter();
        c.draw_series(ticks.map(|(x, name)| EmptyElement::at((x, 0.0)) + Text::new(name, (0, 6), under.clone())))
            .map_err(plot_err)?;
        let share: Vec<(f64, f64)> =
            labelled_share.iter().enumerate().filter_map(|(i, s)| s.map(|s| (i as f64 + 0.5, s))).collect();
        c.draw_secondary_series(LineSeries::new(share.clone(), COLORS[1].stroke_width(2)))
            .map_err(plot_err)?
            .label("share of reviews labelled")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], COLORS[1].stroke_width(2)));
        c.draw_secondary_series(share.into_iter().map(|p| Circle::new(p, 4, COLORS[1].filled()))).map_err(plot_err)?;
        c.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.85))
            .draw()
            .map_err(plot_err)?;
        Ok(())
    })
}

/// Distances (KS, TVD) per time bucket, a line and points per series, with a horizontal line at
/// `alert` (the distance operators alert on).
pub fn distance_svg(title: &str, buckets: &[String], series: &[Series], alert: f64) -> anyhow::Result<String> {
    svg("drift chart", (760, 400), |root| {
        let n = buckets.len().max(1) as f64;
        let top = series.iter().flat_map(|s| s.values.iter().flatten()).fold(alert, |a, &v| a.max(v)) * 1.15;
        let mut c = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(48)
            .build_cartesian_2d(0f64..n, 0f64..top.min(1.0))
            .map_err(plot_err)?;
        c.configure_mesh()
            .disable_x_mesh()
            .disable_x_axis()
            .light_line_style(TRANSPARENT)
            .y_desc("distance from the reference")
            .draw()
            .map_err(plot_err)?;
        let under = style(12).pos(Pos::new(HPos::Center, VPos::Top));
        let ticks = bucket_ticks(buckets).into_iter();
        c.draw_series(ticks.map(|(x, name)| EmptyElement::at((x, 0.0)) + Text::new(name, (0, 6), under.clone())))
            .map_err(plot_err)?;
        c.draw_series(DashedLineSeries::new([(0.0, alert), (n, alert)], 6, 4, BLACK.mix(0.6).into()))
            .map_err(plot_err)?
            .label(format!("alert at {alert}"))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK.mix(0.6)));
        for (s, color) in series.iter().zip(COLORS.iter().cycle()) {
            let pts: Vec<(f64, f64)> =
                s.values.iter().enumerate().filter_map(|(i, v)| v.map(|v| (i as f64 + 0.5, v))).collect();
            c.draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(plot_err)?
                .label(s.name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            c.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled()))).map_err(plot_err)?;
        }
        c.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.85))
            .draw()
            .map_err(plot_err)?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chart_draws_its_data_and_escapes_its_text() {
        let marks = [PrMark { name: "review_at 0.30".into(), recall: 0.9, precision: 0.6 }];
        let pr = pr_curve_svg("PR", &[(0.0, 1.0), (0.5, 0.8), (1.0, 0.5)], &marks).unwrap();
        assert!(pr.starts_with("<svg") && pr.contains("<polyline") && pr.contains("<circle"), "{pr}");
        let panel =
            ConfusionPanel { name: "<script>".into(), rows: vec![("allow".into(), [1, 7]), ("block".into(), [4, 0])] };
        let heat = confusion_svg("by kind", &[panel]).unwrap();
        assert!(heat.contains("&lt;script&gt; (n = 12)") && !heat.contains("<script>"), "{heat}");
        assert!(heat.matches("<rect").count() >= 4, "{heat}");
        let one = ["2026-12-04".to_string()];
        let load = review_load_svg(&one, &[3], &[Some(0.5)]).unwrap();
        assert!(load.contains("<rect") && load.contains("<circle") && load.contains("2026-12-04"), "{load}");
        let ks = Series { name: "risk_score".into(), values: vec![Some(0.2)] };
        let drift = distance_svg("KS", &one, &[ks], 0.1).unwrap();
        assert!(drift.contains("<circle") && drift.contains("alert at 0.1"), "{drift}");
        assert!(distance_svg("KS", &[], &[], 0.1).unwrap().contains("<svg"), "no buckets: axes only");
    }
}
