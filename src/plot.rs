//! SVG charts with the `plotters` crate (SVG backend only: text is written as SVG `<text>`
//! elements and laid out with plotters' built-in size estimate, so no system font library is
//! needed): ECDFs of live vs reference samples (`tiergate drift --plot`), reliability diagrams
//! (`tiergate calibrate --plot`, `tiergate report`) and the feedback report's charts
//! ([`quality`]).

pub mod quality;

use crate::calibrate::ReliabilityBin;
use anyhow::Context as _;
use plotters::prelude::*;
use std::path::Path;

/// Most points drawn per ECDF: a step at every sample of a 100,000-decision window would make a
/// file of megabytes that looks the same.
const MAX_STEPS: usize = 200;

/// One ECDF panel: two sorted samples of one signal.
pub struct EcdfPanel<'a> {
    /// The panel's title (the signal and its distance).
    pub title: String,
    /// x axis label.
    pub x_label: &'static str,
    pub reference: &'a [f64],
    pub live: &'a [f64],
    /// Log-scaled x axis (text lengths span decades).
    pub log_x: bool,
}

fn plot_err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// The ECDF of a sorted sample as a step line, thinned to at most [`MAX_STEPS`] steps; none for
/// an empty sample.
fn steps(sorted: &[f64]) -> Vec<(f64, f64)> {
    let n = sorted.len();
    if n == 0 {
        return Vec::new();
    }
    let stride = n.div_ceil(MAX_STEPS).max(1);
    let mut out = Vec::with_capacity(2 * n / stride + 2);
    let mut last_y = 0.0;
    for i in (0..n).step_by(stride).chain(std::iter::once(n.saturating_sub(1))) {
        let (x, y) = (sorted[i], (i + 1) as f64 / n as f64);
        out.push((x, last_y));
        out.push((x, y));
        last_y = y;
    }
    out
}

/// Draws `panels` side by side into an SVG file at `path` (a panel with an empty sample draws
/// its axes and legend only). Errors: an empty panel list, or the file cannot be written
/// (naming it).
pub fn ecdf_svg(path: &Path, panels: &[EcdfPanel<'_>]) -> anyhow::Result<()> {
    anyhow::ensure!(!panels.is_empty(), "nothing to plot");
    ecdf(path, panels).with_context(|| format!("drawing the plot {}", path.display()))
}

fn ecdf(path: &Path, panels: &[EcdfPanel<'_>]) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (420 * panels.len() as u32, 360)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    for (area, panel) in root.split_evenly((1, panels.len())).iter().zip(panels) {
        let all = panel.reference.iter().chain(panel.live).copied();
        let (lo, hi) = all.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| (lo.min(x), hi.max(x)));
        let (lo, hi) = if lo.is_finite() { (lo, if hi > lo { hi } else { lo + 1.0 }) } else { (0.0, 1.0) };
        let mut chart = ChartBuilder::on(area);
        chart.caption(&panel.title, ("sans-serif", 16)).margin(12).x_label_area_size(36).y_label_area_size(44);
        let series = [(panel.reference, "reference", BLUE), (panel.live, "live", RED)];
        if panel.log_x {
            let mut c =
                chart.build_cartesian_2d((lo.max(1.0)..hi.max(2.0)).log_scale(), 0f64..1f64).map_err(plot_err)?;
            c.configure_mesh()
                .light_line_style(TRANSPARENT)
                .x_desc(panel.x_label)
                .y_desc("ECDF")
                .draw()
                .map_err(plot_err)?;
            for (sample, name, color) in series {
                let pts = steps(sample).into_iter().map(|(x, y)| (x.max(1.0), y));
                c.draw_series(LineSeries::new(pts, color.stroke_width(2)))
                    .map_err(plot_err)?
                    .label(format!("{name} (n = {})", sample.len()))
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            }
            c.configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .border_style(BLACK)
                .background_style(WHITE.mix(0.8))
                .draw()
                .map_err(plot_err)?;
        } else {
            let mut c = chart.build_cartesian_2d(lo..hi, 0f64..1f64).map_err(plot_err)?;
            c.configure_mesh()
                .light_line_style(TRANSPARENT)
                .x_desc(panel.x_label)
                .y_desc("ECDF")
                .draw()
                .map_err(plot_err)?;
            for (sample, name, color) in series {
                c.draw_series(LineSeries::new(steps(sample), color.stroke_width(2)))
                    .map_err(plot_err)?
                    .label(format!("{name} (n = {})", sample.len()))
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            }
            c.configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .border_style(BLACK)
                .background_style(WHITE.mix(0.8))
                .draw()
                .map_err(plot_err)?;
        }
    }
    root.present().map_err(plot_err)
}

/// One curve of a reliability diagram.
pub struct ReliabilityCurve<'a> {
    /// Legend text, e.g. "T = 1.000, ECE 0.041".
    pub name: String,
    pub bins: &'a [ReliabilityBin],
}

/// Draws a reliability diagram (accuracy against mean confidence per non-empty bin, with the
/// diagonal of perfect calibration) of `curves` into an SVG file at `path`. Errors: the file
/// cannot be written (naming it).
pub fn reliability_svg(path: &Path, title: &str, curves: &[ReliabilityCurve<'_>]) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, RELIABILITY_SIZE).into_drawing_area();
    reliability(root, title, curves).with_context(|| format!("drawing the plot {}", path.display()))
}

/// [`reliability_svg`] as an SVG document in a string (for a page that inlines it).
pub fn reliability_svg_string(title: &str, curves: &[ReliabilityCurve<'_>]) -> anyhow::Result<String> {
    let mut svg = String::new();
    reliability(SVGBackend::with_string(&mut svg, RELIABILITY_SIZE).into_drawing_area(), title, curves)
        .context("drawing the reliability diagram")?;
    Ok(svg)
}

/// A reliability diagram's size in pixels.
const RELIABILITY_SIZE: (u32, u32) = (560, 520);

fn reliability(
    root: DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    title: &str,
    curves: &[ReliabilityCurve<'_>],
) -> anyhow::Result<()> {
    root.fill(&WHITE).map_err(plot_err)?;
    // Binary classification: the predicted class's confidence is at least 0.5.
    let lo = curves.iter().flat_map(|c| c.bins.iter().filter(|b| b.count > 0)).map(|b| b.lower).fold(0.5f64, f64::min);
    let mut c = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(48)
        .build_cartesian_2d(lo..1f64, 0f64..1f64)
        .map_err(plot_err)?;
    c.configure_mesh()
        .light_line_style(TRANSPARENT)
        .x_desc("mean confidence in bin")
        .y_desc("accuracy in bin")
        .draw()
        .map_err(plot_err)?;
    c.draw_series(LineSeries::new([(lo, lo), (1.0, 1.0)], BLACK.mix(0.5)))
        .map_err(plot_err)?
        .label("perfect calibration")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK.mix(0.5)));
    for (curve, color) in curves.iter().zip([RED, BLUE, GREEN, MAGENTA]) {
        let pts: Vec<(f64, f64)> =
            curve.bins.iter().filter(|b| b.count > 0).map(|b| (b.mean_confidence, b.accuracy)).collect();
        c.draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(plot_err)?
            .label(curve.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        c.draw_series(pts.into_iter().map(|p| Circle::new(p, 4, color.filled()))).map_err(plot_err)?;
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)
}

#[cfg(test)]
mod tests {
    #[test]
    fn steps_are_thinned_and_end_at_one() {
        let v: Vec<f64> = (0..10_000).map(|i| i as f64).collect();
        let s = super::steps(&v);
        assert!(s.len() <= 2 * super::MAX_STEPS + 2, "{}", s.len());
        assert_eq!(s.last(), Some(&(9999.0, 1.0)));
        assert_eq!(super::steps(&[3.0]), vec![(3.0, 0.0), (3.0, 1.0), (3.0, 1.0), (3.0, 1.0)]);
        assert_eq!(super::steps(&[]), vec![]);
    }

    #[test]
    fn a_panel_without_live_samples_is_drawn_and_an_unwritable_path_is_named() {
        let dir = std::env::temp_dir().join(format!("tiergate-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let panel = |live| super::EcdfPanel {
            title: "ood_score".into(),
            x_label: "OOD score",
            reference: &[0.1, 0.2],
            live,
            log_x: false,
        };
        super::ecdf_svg(&dir.join("empty.svg"), &[panel(&[])]).unwrap();
        assert!(std::fs::read_to_string(dir.join("empty.svg")).unwrap().contains("live (n = 0)"));
        let missing = dir.join("no/such/dir/x.svg");
        let err = format!("{:#}", super::ecdf_svg(&missing, &[panel(&[0.5])]).unwrap_err());
        assert!(err.contains(&missing.display().to_string()), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
