//! `tiergate calibrate`: fit a tier's temperature on labelled JSONL and report ECE and NLL
//! before and after, with a reliability table and a held-out check.
//!
//! `--tier cpu` (the default) runs the cpu model in-process; `--tier gpu` asks the configured
//! gpu tier: the upstream pool of model servers (its label probabilities, normalised over the
//! two labels, become the two-class logits `[0, logit(p_risk)]`; unsure answers and errors are
//! counted and left out), or the onnx backend's model in-process.

use anyhow::Context as _;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tiergate::calibrate::{confidences, ece, fit_temperature, nll, reliability, CalibrationFile};
use tiergate::config::Config;
use tiergate::plot::{reliability_svg, ReliabilityCurve};
use tiergate::policy::Policy;
use tiergate::tier::gpu::upstream::UpstreamPool;
use tiergate::tier::model::{ModelAssets, SessionOptions};
use tiergate::tier::ModelConfig;

/// Which tier's temperature to fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Tier {
    /// The cpu model (`[model]`, its `calibration.json`).
    Cpu,
    /// The gpu tier: `[gpu.upstream] temperature`, or the `[gpu.onnx]` model's `calibration.json`.
    Gpu,
}

/// The command's arguments.
pub struct Args {
    pub input: PathBuf,
    pub config: Option<PathBuf>,
    /// The calibrated model's directory, overriding `model.dir` (or `gpu.onnx.dir`).
    pub models: Option<PathBuf>,
    pub bins: usize,
    /// Path of the calibration file to write, and whether to write even a fit that does not
    /// improve on held-out data.
    pub write: Option<(PathBuf, bool)>,
    pub tier: Tier,
    /// SVG file for the reliability diagram before (T = 1) and after (fitted T) scaling.
    pub plot: Option<PathBuf>,
}

#[derive(serde::Deserialize)]
struct Labelled {
    text: String,
    label: usize,
}

/// Logits of the examples a tier could score, their labels, and the tier's temperature now.
struct Scored {
    logits: Vec<Vec<f32>>,
    labels: Vec<usize>,
    current: f64,
    name: String,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let config = crate::load_config(args.config.clone())?;
    let examples = read_labelled(&args.input)?;
    let upstream = args.tier == Tier::Gpu && config.gpu.backend == "upstream";
    let scored = match args.tier {
        Tier::Cpu => model_logits(&config, &config.model, args.models.as_deref(), &examples)?,
        Tier::Gpu => match config.gpu.backend.as_str() {
            "onnx" => model_logits(&config, &config.gpu.onnx, args.models.as_deref(), &examples)?,
            "upstream" => upstream_logits(&config, &examples)?,
            "none" => anyhow::bail!("--tier gpu: the config has no gpu tier (gpu.backend = \"none\")"),
            other => anyhow::bail!(
                "--tier gpu: gpu.backend {other:?} brings its own calibration (only onnx and upstream are calibrated here)"
            ),
        },
    };
    anyhow::ensure!(scored.labels.len() >= 2, "need at least 2 examples the tier could score");
    println!("{} examples from {}; {}", scored.labels.len(), args.input.display(), scored.name);
    let fitted = fit_temperature(&scored.logits, &scored.labels);
    report(&scored, fitted, args.bins);
    if let Some(svg) = &args.plot {
        plot(&scored, fitted, args.bins, svg)?;
        println!("\nreliability diagram: {}", svg.display());
    }
    if upstream {
        let (held_t, verdict) = held_out_check(&scored.logits, &scored.labels, scored.current, args.bins);
        println!("\nheld-out check (fitted on a seeded 70 %, T = {held_t:.4}, scored on the other 30 %): {verdict}");
        println!("\nto use it, set under [gpu.upstream] in the config:\ntemperature = {fitted:.4}");
        anyhow::ensure!(
            args.write.is_none(),
            "--write writes a model's calibration file; the upstream tier's temperature lives in the config \
             (`[gpu.upstream] temperature`, printed above)"
        );
        return Ok(());
    }
    match &args.write {
        Some((path, force)) => write(&scored, fitted, args.bins, &args.input, path, *force),
        None => Ok(()),
    }
}

fn read_labelled(input: &Path) -> anyhow::Result<Vec<Labelled>> {
    let text = std::fs::read_to_string(input).with_context(|| format!("reading {}", input.display()))?;
    let mut examples = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let ex: Labelled = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: expected {{\"text\": str, \"label\": 0|1}}", input.display(), i + 1))?;
        anyhow::ensure!(ex.label <= 1, "{}:{}: `label` must be 0 or 1, got {}", input.display(), i + 1, ex.label);
        examples.push(ex);
    }
    anyhow::ensure!(examples.len() >= 2, "{}: need at least 2 labelled examples", input.display());
    Ok(examples)
}

/// An in-process model's logits (the cpu model, or the gpu tier's onnx model).
fn model_logits(
    config: &Config,
    model: &ModelConfig,
    dir: Option<&Path>,
    examples: &[Labelled],
) -> anyhow::Result<Scored> {
    let env = tiergate::ort_lib::environment(config.model.onnxruntime.as_deref()).map_err(anyhow::Error::msg)?;
    let assets = ModelAssets::load(dir.unwrap_or(&model.dir))?;
    let mut classifier = assets.classifier(env, SessionOptions::from(model), None)?;
    let mut logits = Vec::with_capacity(examples.len());
    for chunk in examples.chunks(16) {
        let texts: Vec<&str> = chunk.iter().map(|e| e.text.as_str()).collect();
        logits.extend(classifier.classify(&texts)?.into_iter().map(|o| o.logits.to_vec()));
    }
    let labels = examples.iter().map(|e| e.label).collect();
    Ok(Scored { logits, labels, current: assets.info.temperature, name: format!("model {}", assets.info.name) })
}

/// The upstream pool's answers as two-class logits `[0, logit(p_risk)]`, four requests at a
/// time, each with the gpu tier's timeout (at least 30 s: calibration is not latency-bound).
fn upstream_logits(config: &Config, examples: &[Labelled]) -> anyhow::Result<Scored> {
    use futures_util::StreamExt as _;
    let policy = Policy::load_dir(&config.policies.dir)?;
    let prompt = policy.prompt.with_context(|| {
        format!("the policy in {} has no [prompt] for the upstream backend", config.policies.dir.display())
    })?;
    let timeout = Duration::from_millis(config.gpu.timeout_ms).max(Duration::from_secs(30));
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let answers = runtime.block_on(async {
        let pool = UpstreamPool::start(&config.gpu.upstream)?;
        let asks = examples.iter().map(|e| pool.answer(&prompt, &e.text, tokio::time::Instant::now() + timeout));
        anyhow::Ok(futures_util::stream::iter(asks).buffered(4).collect::<Vec<_>>().await)
    })?;
    let (mut logits, mut labels, mut unsure, mut errors) = (Vec::new(), Vec::new(), 0, Vec::new());
    for (example, answer) in examples.iter().zip(answers) {
        match answer.map(|a| a.parsed.p_risk()) {
            Ok(Some(p)) => {
                let p = p.clamp(1e-12, 1.0 - 1e-12);
                logits.push(vec![0.0, (p / (1.0 - p)).ln() as f32]);
                labels.push(example.label);
            }
            Ok(None) => unsure += 1,
            Err(e) => errors.push(e.to_string()),
        }
    }
    println!("upstream: {} answers with a probability, {unsure} unsure, {} errors", labels.len(), errors.len());
    for e in errors.iter().take(3) {
        println!("  error: {e}");
    }
    let current = config.gpu.upstream.temperature;
    Ok(Scored { logits, labels, current, name: format!("upstream model {}", config.gpu.upstream.model) })
}

/// Accuracy, NLL and ECE at T = 1, now and fitted, and the reliability table at the fit.
fn report(s: &Scored, fitted: f64, bins: usize) {
    println!("{:<16} {:>8} {:>9} {:>8} {:>8}", "", "T", "accuracy", "NLL", format!("ECE({bins})"));
    for (name, t) in [("uncalibrated", 1.0), ("current", s.current), ("fitted", fitted)] {
        let (conf, correct) = confidences(&s.logits, &s.labels, t);
        let acc = correct.iter().filter(|&&c| c).count() as f64 / correct.len() as f64;
        let nll = nll(&s.logits, &s.labels, t);
        println!("{name:<16} {t:>8.4} {acc:>9.4} {nll:>8.4} {:>8.4}", ece(&conf, &correct, bins));
    }
    let (conf, correct) = confidences(&s.logits, &s.labels, fitted);
    println!("\nreliability at fitted T = {fitted:.4}:");
    println!("{:>13} {:>6} {:>10} {:>9}", "confidence", "n", "mean conf", "accuracy");
    for b in reliability(&conf, &correct, bins).iter().filter(|b| b.count > 0) {
        println!("  [{:.3},{:.3}) {:>6} {:>10.4} {:>9.4}", b.lower, b.upper, b.count, b.mean_confidence, b.accuracy);
    }
}

/// The reliability diagram at T = 1 and at the fitted T, with each one's ECE in the legend.
fn plot(s: &Scored, fitted: f64, bins: usize, svg: &Path) -> anyhow::Result<()> {
    let binned = [1.0, fitted].map(|t| {
        let (conf, correct) = confidences(&s.logits, &s.labels, t);
        (t, ece(&conf, &correct, bins), reliability(&conf, &correct, bins))
    });
    let curves: Vec<ReliabilityCurve<'_>> = binned
        .iter()
        .zip(["before", "after"])
        .map(|((t, e, b), when)| ReliabilityCurve { name: format!("{when}: T = {t:.3}, ECE {e:.4}"), bins: b })
        .collect();
    let title = format!("{}: reliability, {} examples", s.name, s.labels.len());
    reliability_svg(svg, &title, &curves)
}

/// Writes the fitted temperature to a model's calibration file, unless the data cannot support
/// it or (without `force`) it improves nothing on held-out rows.
fn write(s: &Scored, fitted: f64, bins: usize, input: &Path, path: &Path, force: bool) -> anyhow::Result<()> {
    let positives = s.labels.iter().filter(|&&l| l == 1).count();
    anyhow::ensure!(
        positives > 0 && positives < s.labels.len(),
        "not writing {}: the input has only one label; temperature scaling needs both",
        path.display()
    );
    anyhow::ensure!(
        (0.02..50.0).contains(&fitted),
        "not writing {}: the fitted temperature {fitted:.3} is at the edge of the search range, \
         a sign of too little or degenerate data",
        path.display()
    );
    let (held_t, verdict) = held_out_check(&s.logits, &s.labels, s.current, bins);
    println!("\nheld-out check (fitted on a seeded 70 %, T = {held_t:.4}, scored on the other 30 %): {verdict}");
    if !force && verdict.starts_with("no improvement") {
        anyhow::bail!("not writing {}: {verdict} (pass --force to write it anyway)", path.display());
    }
    let mut extra = serde_json::Map::new();
    extra.insert("fitted_on".into(), input.display().to_string().into());
    extra.insert("n".into(), s.labels.len().into());
    let file = CalibrationFile {
        temperature: fitted,
        method: Some("temperature scaling (Guo et al. 2017), NLL minimised by `tiergate calibrate`".into()),
        extra,
    };
    std::fs::write(path, serde_json::to_string_pretty(&file)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    println!("\nwrote T = {fitted:.4} to {}", path.display());
    // The model directory's manifest pins this file: without the new digest the model would no
    // longer load.
    if tiergate::tier::manifest::record(path)? {
        println!("updated its line in {}", path.with_file_name(tiergate::tier::manifest::MANIFEST).display());
    }
    Ok(())
}

/// Fits the temperature on a seeded 70 % of the examples and compares it with `current` on the
/// other 30 %: `"improves ..."` or `"no improvement ..."`, with the numbers.
pub fn held_out_check(logits: &[Vec<f32>], labels: &[usize], current: f64, bins: usize) -> (f64, String) {
    let mut order: Vec<usize> = (0..labels.len()).collect();
    fastrand::Rng::with_seed(20260101).shuffle(&mut order);
    let cut = (order.len() * 7 / 10).max(1);
    let pick = |idx: &[usize]| -> (Vec<Vec<f32>>, Vec<usize>) {
        (idx.iter().map(|&i| logits[i].clone()).collect(), idx.iter().map(|&i| labels[i]).collect())
    };
    let ((fit_l, fit_y), (held_l, held_y)) = (pick(&order[..cut]), pick(&order[cut..]));
    if held_y.is_empty() {
        return (current, "no improvement: too few examples to hold any out".into());
    }
    let t = fit_temperature(&fit_l, &fit_y);
    let score = |t: f64| {
        let (conf, correct) = confidences(&held_l, &held_y, t);
        (ece(&conf, &correct, bins), nll(&held_l, &held_y, t))
    };
    let ((ece_now, nll_now), (ece_fit, nll_fit)) = (score(current), score(t));
    let numbers =
        format!("ECE {ece_now:.4} -> {ece_fit:.4}, NLL {nll_now:.4} -> {nll_fit:.4} on {} rows", held_y.len());
    match (ece_fit < ece_now, nll_fit < nll_now) {
        (false, false) => (t, format!("no improvement over T = {current:.4}: {numbers}")),
        _ => (t, format!("improves on T = {current:.4}: {numbers}")),
    }
}

#[cfg(test)]
mod tests {
    use super::held_out_check;

    #[test]
    fn a_fit_that_cannot_improve_is_refused_and_one_that_does_is_not() {
        // Separable with huge margins: every temperature scores 0 ECE and 0 NLL; nothing to gain.
        let labels: Vec<usize> = (0..40).map(|i| i % 2).collect();
        let sure: Vec<Vec<f32>> =
            labels.iter().map(|&y| if y == 1 { vec![-200.0, 200.0] } else { vec![200.0, -200.0] }).collect();
        assert!(held_out_check(&sure, &labels, 1.0, 15).1.starts_with("no improvement"));
        // Overconfident at T = 1 (every third answer wrong at logit margin 6): a larger T helps.
        let over: Vec<Vec<f32>> = labels
            .iter()
            .enumerate()
            .map(|(i, &y)| if (y == 1) != (i % 3 == 0) { vec![-3.0, 3.0] } else { vec![3.0, -3.0] })
            .collect();
        let (t, verdict) = held_out_check(&over, &labels, 1.0, 15);
        assert!(verdict.starts_with("improves") && t > 1.0, "{t}: {verdict}");
    }

    #[test]
    fn upstream_logits_scale_like_the_tier() {
        // Two-class logits [0, logit(p)] at T give sigmoid(logit(p) / T), the tier's own scaling.
        let p: f64 = 0.8;
        let z = (p / (1.0 - p)).ln() as f32;
        let scaled = tiergate::calibrate::softmax_t(&[0.0, z], 2.0)[1];
        assert!((scaled - tiergate::tier::gpu::upstream::scale(p, 2.0)).abs() < 1e-6);
    }
}
