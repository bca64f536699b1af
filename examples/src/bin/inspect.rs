//! `inspect`: what a sampler chain does at each step of a generation, as
//! pictures and JSON.
//!
//! ```text
//! cargo run --release -p sampler-examples --bin inspect -- \
//!     --prompt "Once upon a time" -n 6 --seed 7 \
//!     --samplers "top_k;top_p;min_p;temperature;dist" --top-k 20 --top-p 0.9 \
//!     --out inspect-out
//! ```
//!
//! Every flag of `generate` that picks the model, the prompt and the chain
//! works here (`--model`, `--chat`, `--config`, `--samplers`, `--top-k`,
//! `--param`, `--seed`, ...). Each step runs the chain's reference stages
//! one by one on the host (`Chain::inspect`: exact, and as slow as a
//! debugging tool may be) and writes into `--out`:
//!
//! * `step-NNN.svg` and `step-NNN.png`: one panel per stage, the top tokens
//!   (their text) before the stage as grey bars, and the drawn token
//!   wherever it ranks, their probability after it
//!   (renormalised over the survivors) in blue, the tokens the stage removed
//!   marked `x` with a line where the cut falls, the drawn token in red;
//! * `summary.svg` and `summary.png`: over the steps, the survivors after
//!   each stage, the entropy of the input and of the final set, and the
//!   drawn token's probability;
//! * `inspect.json`: the same data (every stage's top tokens with ids,
//!   text, logits, probabilities before and after, survivors, masses, the
//!   uniform that drew the token).
//!
//! See `docs/inspect.md`.

#[allow(dead_code)]
#[path = "generate.rs"]
mod generate;

use std::path::PathBuf;
use std::process::ExitCode;

use burn_tensor::Tensor;
use clap::Parser;
use generate::AppError;
use plotters::coord::Shift;
use plotters::prelude::*;
use sampler_core::{CandidateSet, Inspection, TokenId};
use sampler_examples::llama2::generate::TextCodec;
use serde_json::{Value, json};

/// Draw what a sampler chain does at each step of a generation: per-stage
/// candidate sets as pictures (SVG and PNG) and JSON.
#[derive(Debug, Parser)]
#[command(name = "inspect", version, about, long_about = None)]
struct InspectArgs {
    #[command(flatten)]
    run: generate::Args,
    /// Directory the pictures and `inspect.json` are written to (created).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Tokens shown per stage (1..=40).
    #[arg(long, value_name = "N", default_value_t = 12,
          value_parser = clap::value_parser!(u64).range(1..=40))]
    top: u64,
}

/// The most steps one run draws (`-n` above it is refused).
const MAX_STEPS: usize = 256;

/// One token row of a stage's panel.
struct Bar {
    label: String,
    before: f64,
    after: f64,
    kept: bool,
    drawn: bool,
}

/// One stage's panel.
struct Panel {
    title: String,
    bars: Vec<Bar>,
}

fn main() -> ExitCode {
    let args = InspectArgs::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: &InspectArgs) -> Result<(), AppError> {
    if a.run.n == 0 || a.run.n > MAX_STEPS {
        return Err(AppError::Usage(format!(
            "-n {}: inspect draws 1..={MAX_STEPS} steps",
            a.run.n
        )));
    }
    if a.run.num_beams.is_some() || a.run.speculative.is_some() {
        return Err(AppError::Usage(
            "inspect shows a sampling chain step by step: --num-beams and --speculative do not apply"
                .into(),
        ));
    }
    let (mut cfg, warnings) = generate::build_chain(&a.run)?;
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    let (device, _) = generate::device_of(&cfg.device)?;
    let path = generate::model_path(&a.run)?;
    let loaded = generate::load_model(&a.run, &path, &device)?;
    let codec: &dyn TextCodec = loaded.codec.as_ref();
    cfg.chain.fill_stop_ids(&codec.stop_ids());
    let mut spec = cfg.chain.clone();
    let seed = *spec
        .seed
        .get_or_insert_with(|| rand_seed(&loaded.prompt_tokens));
    let mut chain = sampler_cpu::build_chain(&spec)
        .map_err(|e| AppError::Usage(format!("the chain cannot be built: {e}")))?;
    std::fs::create_dir_all(&a.out)?;
    plotters::style::register_font(
        "sans-serif",
        FontStyle::Normal,
        dejavu::sans_mono::regular(),
    )
    .map_err(|_| AppError::Usage("the embedded font could not be loaded".into()))?;

    let model = &loaded.model;
    let prompt = &loaded.prompt_tokens;
    let seq_len = model.config().seq_len;
    let mut cache = model.new_batch_cache(1);
    let last = prompt.len().saturating_sub(1);
    if last > 0 {
        let positions: Vec<usize> = (0..last).collect();
        drop(model.forward_batch(&prompt[..last], &positions, &vec![0; last], &mut cache)?);
    }
    chain.accept_prompt(prompt);
    let stops = codec.stop_ids();
    let (mut token, mut pos) = (prompt[last], last);
    let mut prev = Some(token);
    let mut steps = Vec::new();
    let mut json_steps = Vec::new();
    let top = a.top as usize;
    for step in 0..a.run.n {
        if pos >= seq_len {
            break;
        }
        let logits: Tensor<2> = model.forward_batch(&[token], &[pos], &[0], &mut cache)?;
        let row: Vec<f32> = logits
            .into_data()
            .try_into_vec::<f32>()
            .map_err(|e| AppError::Usage(format!("logits: {e:?}")))?;
        let seen = chain.inspect(&row).map_err(|source| {
            AppError::Generate(sampler_examples::llama2::generate::GenerateError::Sample {
                step,
                source,
            })
        })?;
        let text = |id: TokenId| piece(codec, prev, id);
        let panels = panels(&seen, top, &text);
        let title = format!(
            "step {step}: drew {} (id {}){}",
            text(seen.token),
            seen.token,
            seen.uniform
                .map(|u| format!(", uniform {u:.4}"))
                .unwrap_or_default()
        );
        let name = a.out.join(format!("step-{step:03}"));
        draw_step(
            SVGBackend::new(&name.with_extension("svg"), step_size(&panels)).into_drawing_area(),
            &title,
            &panels,
        )
        .map_err(draw_err)?;
        draw_step(
            BitMapBackend::new(&name.with_extension("png"), step_size(&panels)).into_drawing_area(),
            &title,
            &panels,
        )
        .map_err(draw_err)?;
        json_steps.push(step_json(&seen, top, &text));
        println!("{title}");
        steps.push(seen.clone());
        let next = seen.token;
        if stops.contains(&next) {
            break;
        }
        prev = Some(next);
        token = next;
        pos += 1;
    }
    let names: Vec<String> = steps
        .first()
        .map(|s| s.stages.iter().map(|v| v.name.clone()).collect())
        .unwrap_or_default();
    let summary = a.out.join("summary");
    draw_summary(
        SVGBackend::new(&summary.with_extension("svg"), (1000, 900)).into_drawing_area(),
        &steps,
        &names,
    )
    .map_err(draw_err)?;
    draw_summary(
        BitMapBackend::new(&summary.with_extension("png"), (1000, 900)).into_drawing_area(),
        &steps,
        &names,
    )
    .map_err(draw_err)?;
    let doc = json!({
        "model": path.display().to_string(),
        "chain": cfg.chain.chain_string(),
        "seed": seed,
        "prompt_tokens": prompt,
        "top": top,
        "steps": json_steps,
    });
    std::fs::write(
        a.out.join("inspect.json"),
        serde_json::to_string_pretty(&doc).map_err(|e| AppError::Usage(e.to_string()))?,
    )?;
    eprintln!(
        "wrote {} steps to {} (step-NNN.svg/.png, summary.svg/.png, inspect.json)",
        steps.len(),
        a.out.display()
    );
    Ok(())
}

/// A seed for a run that gave none: from the clock, printed in the JSON so
/// that the run can be replayed.
fn rand_seed(prompt: &[TokenId]) -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ (prompt.len() as u64).rotate_left(32)
}

fn draw_err<E: std::fmt::Debug>(e: E) -> AppError {
    AppError::Usage(format!("drawing failed: {e:?}"))
}

/// A token's text as a label: what it adds after `prev`, escaped.
fn piece(codec: &dyn TextCodec, prev: Option<TokenId>, id: TokenId) -> String {
    let bytes = codec.piece_bytes(prev, id);
    let s = String::from_utf8_lossy(&bytes);
    let escaped: String = s.escape_debug().collect();
    format!("'{escaped}'")
}

/// One panel per stage: the top tokens of the set before it.
fn panels(seen: &Inspection, top: usize, text: &dyn Fn(TokenId) -> String) -> Vec<Panel> {
    let mut out = Vec::with_capacity(seen.stages.len());
    let mut before: &CandidateSet = &seen.input;
    let last = seen.stages.len().saturating_sub(1);
    for (j, v) in seen.stages.iter().enumerate() {
        // The top tokens before the stage, and the drawn one wherever it
        // ranks (followed through every stage).
        let shown = before
            .ids
            .iter()
            .zip(&before.probs)
            .enumerate()
            .filter(|&(rank, (&id, _))| rank < top || id == seen.token);
        let bars = shown
            .map(|(_, pair)| pair)
            .map(|(&id, &p)| {
                let after = v.set.prob_of(id);
                Bar {
                    label: format!("{} {id}", text(id)),
                    before: p,
                    after,
                    kept: v.set.ids.contains(&id),
                    drawn: id == seen.token && j == last,
                }
            })
            .collect();
        let noop = if v.noop { " (no-op)" } else { "" };
        out.push(Panel {
            title: format!(
                "{}{noop}: {} of {} kept, {:.1} % of the mass",
                v.name,
                v.set.survivors(),
                before.survivors(),
                100.0 * v.mass_kept
            ),
            bars,
        });
        before = &v.set;
    }
    out
}

fn step_size(panels: &[Panel]) -> (u32, u32) {
    let rows: usize = panels.iter().map(|p| p.bars.len().max(1)).sum();
    (1000, 50 + (panels.len() * 50 + rows * 22) as u32)
}

fn draw_step<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    panels: &[Panel],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let (head, mut body) = root.split_vertically(44);
    head.draw(&Text::new(
        title.to_string(),
        (12, 12),
        ("sans-serif", 20).into_font().color(&BLACK),
    ))?;
    for p in panels {
        let h = 50 + p.bars.len().max(1) as u32 * 22;
        let (area, rest) = body.split_vertically(h);
        body = rest;
        draw_panel(&area, p)?;
    }
    root.present()
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &Panel,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let n = p.bars.len().max(1) as f64;
    let max = p
        .bars
        .iter()
        .map(|b| b.before.max(b.after))
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, ("sans-serif", 15))
        .margin(6)
        .x_label_area_size(0)
        .y_label_area_size(0)
        .build_cartesian_2d(-0.5 * max..1.08 * max, 0.0..n)?;
    let y = |i: usize| n - i as f64;
    chart.draw_series(p.bars.iter().enumerate().map(|(i, b)| {
        Rectangle::new(
            [(0.0, y(i) - 0.85), (b.before, y(i) - 0.15)],
            RGBColor(210, 210, 210).filled(),
        )
    }))?;
    chart.draw_series(
        p.bars
            .iter()
            .enumerate()
            .filter(|(_, b)| b.kept)
            .map(|(i, b)| {
                let color = if b.drawn {
                    RGBColor(200, 30, 30)
                } else {
                    RGBColor(40, 90, 200)
                };
                Rectangle::new([(0.0, y(i) - 0.7), (b.after, y(i) - 0.3)], color.filled())
            }),
    )?;
    chart.draw_series(p.bars.iter().enumerate().map(|(i, b)| {
        let mark = match (b.kept, b.drawn) {
            (_, true) => "> ",
            (true, false) => "  ",
            (false, false) => "x ",
        };
        Text::new(
            format!("{mark}{}", b.label),
            (-0.49 * max, y(i) - 0.22),
            ("sans-serif", 13).into_font(),
        )
    }))?;
    chart.draw_series(p.bars.iter().enumerate().map(|(i, b)| {
        Text::new(
            format!("{:.3} -> {:.3}", b.before, b.after),
            (
                b.before.max(b.after).min(0.86 * max) + 0.01 * max,
                y(i) - 0.22,
            ),
            ("sans-serif", 11).into_font(),
        )
    }))?;
    // The cut: where the kept tokens end in the order before the stage.
    if let Some(first_cut) = p.bars.iter().position(|b| !b.kept)
        && first_cut > 0
    {
        let at = y(first_cut);
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(-0.5 * max, at), (1.08 * max, at)],
            RGBColor(200, 30, 30).stroke_width(2),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            "cut",
            (0.95 * max, at - 0.1),
            ("sans-serif", 12).into_font().color(&RGBColor(200, 30, 30)),
        )))?;
    }
    Ok(())
}

fn draw_summary<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    steps: &[Inspection],
    names: &[String],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let parts = root.split_evenly((3, 1));
    let n = steps.len().max(1) as f64;
    let palette = [
        RGBColor(40, 90, 200),
        RGBColor(200, 30, 30),
        RGBColor(30, 150, 60),
        RGBColor(200, 120, 0),
        RGBColor(120, 40, 160),
        RGBColor(0, 150, 150),
        RGBColor(90, 90, 90),
    ];
    // Survivors after each stage (log scale).
    let most = steps
        .iter()
        .map(|s| s.input.survivors())
        .max()
        .unwrap_or(1)
        .max(2) as f64;
    let mut c = ChartBuilder::on(&parts[0])
        .caption("survivors after each stage", ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..n, (1.0..most * 1.5).log_scale())?;
    c.configure_mesh().x_desc("step").draw()?;
    for (j, name) in names.iter().enumerate() {
        let color = palette[j % palette.len()];
        c.draw_series(LineSeries::new(
            steps.iter().enumerate().map(|(i, s)| {
                let k = s.stages.get(j).map_or(1, |v| v.set.survivors());
                (i as f64 + 0.5, k.max(1) as f64)
            }),
            color.stroke_width(2),
        ))?
        .label(format!("{j}: {name}"))
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2)));
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    // Entropy of the input and of the final set.
    let top_h = steps
        .iter()
        .map(|s| s.input.entropy())
        .fold(0.1f64, f64::max);
    let mut c = ChartBuilder::on(&parts[1])
        .caption(
            "entropy (nats): model row and final set",
            ("sans-serif", 16),
        )
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..n, 0.0..top_h * 1.1)?;
    c.configure_mesh().x_desc("step").draw()?;
    let final_set = |s: &Inspection| s.stages.last().map(|v| v.set.clone());
    c.draw_series(LineSeries::new(
        steps
            .iter()
            .enumerate()
            .map(|(i, s)| (i as f64 + 0.5, s.input.entropy())),
        palette[0].stroke_width(2),
    ))?
    .label("model row")
    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], palette[0].stroke_width(2)));
    c.draw_series(LineSeries::new(
        steps
            .iter()
            .enumerate()
            .map(|(i, s)| (i as f64 + 0.5, final_set(s).map_or(0.0, |f| f.entropy()))),
        palette[1].stroke_width(2),
    ))?
    .label("final set")
    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], palette[1].stroke_width(2)));
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    // The drawn token's probability.
    let mut c = ChartBuilder::on(&parts[2])
        .caption("drawn token's probability", ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..n, 0.0..1.05)?;
    c.configure_mesh().x_desc("step").draw()?;
    c.draw_series(steps.iter().enumerate().map(|(i, s)| {
        let p = final_set(s).map_or(0.0, |f| f.prob_of(s.token));
        Circle::new((i as f64 + 0.5, p), 4, palette[1].filled())
    }))?
    .label("in the final set")
    .legend(|(x, y)| Circle::new((x + 8, y), 4, palette[1].filled()));
    c.draw_series(LineSeries::new(
        steps
            .iter()
            .enumerate()
            .map(|(i, s)| (i as f64 + 0.5, s.input.prob_of(s.token))),
        palette[0].stroke_width(1),
    ))?
    .label("in the model row")
    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], palette[0].stroke_width(1)));
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()
}

/// One step as JSON: every stage's top tokens before it, with what it did.
fn step_json(seen: &Inspection, top: usize, text: &dyn Fn(TokenId) -> String) -> Value {
    let mut before = &seen.input;
    let mut stages = Vec::new();
    for v in &seen.stages {
        let tokens: Vec<Value> = before
            .ids
            .iter()
            .zip(&before.probs)
            .zip(&before.logits)
            .take(top)
            .map(|((&id, &p), &l)| {
                let after = v.set.ids.iter().position(|&x| x == id);
                json!({
                    "id": id,
                    "text": text(id),
                    "logit_before": l,
                    "prob_before": p,
                    "kept": after.is_some(),
                    "logit_after": after.map(|i| v.set.logits[i]),
                    "prob_after": after.map_or(0.0, |i| v.set.probs[i]),
                })
            })
            .collect();
        stages.push(json!({
            "index": v.index,
            "name": v.name,
            "noop": v.noop,
            "survivors_before": before.survivors(),
            "survivors": v.set.survivors(),
            "mass_kept": v.mass_kept,
            "mass_kept_of_input": v.mass_kept_of_input,
            "entropy": v.set.entropy(),
            "top_before": tokens,
        }));
        before = &v.set;
    }
    json!({
        "step": seen.step,
        "token": seen.token,
        "text": text(seen.token),
        "uniform": seen.uniform,
        "input_entropy": seen.input.entropy(),
        "drawn_prob": seen.stages.last().map_or(0.0, |v| v.set.prob_of(seen.token)),
        "stages": stages,
    })
}
