//! What a sampler chain does at each step of a generation, as pictures and
//! JSON: the `inspect` command's files and the HTTP server's `/inspect` page.
//!
//! [`generate`] runs a model step by step and passes each row through
//! [`Chain::inspect`] (the reference stages one by one on the host: exact,
//! and as slow as a debugging tool may be). For each step, [`step_svg`] /
//! [`write_step`] draw one panel per stage: the top tokens before the stage
//! (their text) as grey bars and the drawn token wherever it ranks, their
//! probability after it (renormalised over the survivors) in blue, the
//! tokens the stage removed marked `x` with a line where the cut falls, the
//! drawn token in red. [`summary_svg`] / [`write_summary`] plot the steps:
//! survivors after each stage (log scale), the entropy of the model's row
//! and of the final set (nats), the drawn token's probability.
//! [`step_json`] is the same data as JSON.

use std::path::Path;
use std::sync::OnceLock;

use burn_tensor::Tensor;
use plotters::coord::Shift;
use plotters::prelude::*;
use sampler_core::{CandidateSet, Chain, Inspection, SampleError, TokenId};
use serde_json::{Value, json};

use crate::llama2::generate::TextCodec;
use crate::llama2::{Llama2, Llama2Error};

/// Tokens shown per stage: at most this many.
pub const MAX_TOP: usize = 40;

/// Why an inspection failed.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The prompt is empty or does not leave room to generate.
    #[error("{0}")]
    Prompt(String),
    /// The model's forward pass failed.
    #[error(transparent)]
    Model(#[from] Llama2Error),
    /// The logits could not be read back.
    #[error("logits: {0}")]
    Logits(String),
    /// The chain failed on a row (e.g. NaN logits).
    #[error("step {step}: sampling failed: {source}")]
    Sample {
        /// Generation step (0-based).
        step: usize,
        /// The row's error.
        source: SampleError,
    },
    /// plotters failed to draw or write a picture.
    #[error("drawing failed: {0}")]
    Draw(String),
}

fn draw_err<E: std::fmt::Debug>(e: E) -> InspectError {
    InspectError::Draw(format!("{e:?}"))
}

/// One step of an inspected generation.
#[derive(Debug, Clone)]
pub struct Step {
    /// What the chain did with the step's row.
    pub seen: Inspection,
    /// The token before this step's (the last prompt token at step 0), for
    /// the text a token adds.
    pub prev: Option<TokenId>,
}

/// Generate up to `n` tokens after `prompt`, passing every row through
/// `chain.inspect`. Stops early at one of the codec's end tokens or of
/// `extra_stops` (included as the last step), at the end of the context, or
/// when `abort` says so before a step (its client has gone).
/// `chain` sees the prompt (BOS left out) as history first, as
/// generation does.
///
/// # Errors
/// [`InspectError::Prompt`] for an empty prompt or one that fills the
/// context; the model's and the chain's errors with their step.
pub fn generate(
    model: &Llama2,
    codec: &dyn TextCodec,
    prompt: &[TokenId],
    chain: &mut Chain,
    n: usize,
    extra_stops: &[TokenId],
    abort: &dyn Fn() -> bool,
) -> Result<Vec<Step>, InspectError> {
    let mut stops = codec.stop_ids();
    stops.extend_from_slice(extra_stops);
    let seq_len = model.config().seq_len;
    if prompt.is_empty() {
        return Err(InspectError::Prompt(
            "the prompt encodes to no tokens".into(),
        ));
    }
    if prompt.len() >= seq_len {
        return Err(InspectError::Prompt(format!(
            "the prompt has {} tokens: the context ({seq_len}) leaves no room to generate",
            prompt.len()
        )));
    }
    let mut cache = model.new_batch_cache(1);
    let last = prompt.len() - 1;
    if last > 0 {
        let positions: Vec<usize> = (0..last).collect();
        drop(model.forward_batch(&prompt[..last], &positions, &vec![0; last], &mut cache)?);
    }
    let bos = codec.bos();
    let history: Vec<TokenId> = prompt.iter().copied().filter(|&t| Some(t) != bos).collect();
    chain.accept_prompt(&history);
    let (mut token, mut pos) = (prompt[last], last);
    let mut steps = Vec::with_capacity(n);
    for step in 0..n {
        if pos >= seq_len || abort() {
            break;
        }
        let logits: Tensor<2> = model.forward_batch(&[token], &[pos], &[0], &mut cache)?;
        let row: Vec<f32> = logits
            .into_data()
            .try_into_vec::<f32>()
            .map_err(|e| InspectError::Logits(format!("{e:?}")))?;
        let seen = chain
            .inspect(&row)
            .map_err(|source| InspectError::Sample { step, source })?;
        let next = seen.token;
        steps.push(Step {
            seen,
            prev: Some(token),
        });
        if stops.contains(&next) {
            break;
        }
        token = next;
        pos += 1;
    }
    Ok(steps)
}

/// Register the embedded font (DejaVu Sans Mono) as plotters'
/// `sans-serif`, once per process; the drawing functions call it.
///
/// # Errors
/// [`InspectError::Draw`] when the font cannot be loaded.
pub fn register_font() -> Result<(), InspectError> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            dejavu::sans_mono::regular(),
        )
        .is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(InspectError::Draw(
            "the embedded font could not be loaded".into(),
        ))
    }
}

/// A token's text as a label: what it adds after `prev`, quoted and
/// escaped (`'\n'`, `' the'`); a token that adds no text (end of text,
/// end of turn) by its vocabulary text, unquoted (`<|im_end|>`).
pub fn piece(codec: &dyn TextCodec, prev: Option<TokenId>, id: TokenId) -> String {
    let bytes = codec.piece_bytes(prev, id);
    if bytes.is_empty()
        && let Some(t) = codec.token_text(id).filter(|t| !t.is_empty())
    {
        return t.escape_debug().collect();
    }
    let s = String::from_utf8_lossy(&bytes);
    let escaped: String = s.escape_debug().collect();
    format!("'{escaped}'")
}

/// The step's heading: the token drawn and the uniform that drew it.
pub fn step_title(step: &Step, codec: &dyn TextCodec) -> String {
    let seen = &step.seen;
    format!(
        "step {}: drew {} (id {}){}",
        seen.step,
        piece(codec, step.prev, seen.token),
        seen.token,
        seen.uniform
            .map(|u| format!(", uniform {u:.4}"))
            .unwrap_or_default()
    )
}

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

/// The step as an SVG document: one panel per stage, `top` tokens each
/// (clamped to 1..=[`MAX_TOP`]). Labels are XML-escaped.
///
/// # Errors
/// [`InspectError::Draw`].
pub fn step_svg(step: &Step, codec: &dyn TextCodec, top: usize) -> Result<String, InspectError> {
    register_font()?;
    let text = |id: TokenId| piece(codec, step.prev, id);
    let panels = panels(&step.seen, top.clamp(1, MAX_TOP), &text);
    let title = step_title(step, codec);
    let mut out = String::new();
    draw_step(
        SVGBackend::with_string(&mut out, step_size(&panels)).into_drawing_area(),
        &title,
        &panels,
    )
    .map_err(draw_err)?;
    Ok(out)
}

/// Write the step as `BASE.svg` and `BASE.png`.
///
/// # Errors
/// [`InspectError::Draw`] (an unwritable path among them).
pub fn write_step(
    step: &Step,
    codec: &dyn TextCodec,
    top: usize,
    base: &Path,
) -> Result<(), InspectError> {
    register_font()?;
    let text = |id: TokenId| piece(codec, step.prev, id);
    let panels = panels(&step.seen, top.clamp(1, MAX_TOP), &text);
    let title = step_title(step, codec);
    let size = step_size(&panels);
    draw_step(
        SVGBackend::new(&base.with_extension("svg"), size).into_drawing_area(),
        &title,
        &panels,
    )
    .map_err(draw_err)?;
    draw_step(
        BitMapBackend::new(&base.with_extension("png"), size).into_drawing_area(),
        &title,
        &panels,
    )
    .map_err(draw_err)
}

/// The size of the summary picture, in pixels.
const SUMMARY_SIZE: (u32, u32) = (1000, 900);

/// The stage names of the chain the steps went through.
fn stage_names(steps: &[Step]) -> Vec<String> {
    steps
        .first()
        .map(|s| s.seen.stages.iter().map(|v| v.name.clone()).collect())
        .unwrap_or_default()
}

/// The summary over the steps as an SVG document.
///
/// # Errors
/// [`InspectError::Draw`].
pub fn summary_svg(steps: &[Step]) -> Result<String, InspectError> {
    register_font()?;
    let seen: Vec<Inspection> = steps.iter().map(|s| s.seen.clone()).collect();
    let mut out = String::new();
    draw_summary(
        SVGBackend::with_string(&mut out, SUMMARY_SIZE).into_drawing_area(),
        &seen,
        &stage_names(steps),
    )
    .map_err(draw_err)?;
    Ok(out)
}

/// Write the summary as `BASE.svg` and `BASE.png`.
///
/// # Errors
/// [`InspectError::Draw`].
pub fn write_summary(steps: &[Step], base: &Path) -> Result<(), InspectError> {
    register_font()?;
    let seen: Vec<Inspection> = steps.iter().map(|s| s.seen.clone()).collect();
    let names = stage_names(steps);
    draw_summary(
        SVGBackend::new(&base.with_extension("svg"), SUMMARY_SIZE).into_drawing_area(),
        &seen,
        &names,
    )
    .map_err(draw_err)?;
    draw_summary(
        BitMapBackend::new(&base.with_extension("png"), SUMMARY_SIZE).into_drawing_area(),
        &seen,
        &names,
    )
    .map_err(draw_err)
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

/// One step as JSON: every stage's top tokens before it (at most `top`,
/// clamped to 1..=[`MAX_TOP`]), with what it did: ids, text, logits and
/// probabilities before and after, survivors, masses, entropy; the drawn
/// token, its text and probability, and the uniform that drew it.
pub fn step_json(step: &Step, codec: &dyn TextCodec, top: usize) -> Value {
    let seen = &step.seen;
    let top = top.clamp(1, MAX_TOP);
    let text = |id: TokenId| piece(codec, step.prev, id);
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
