//! `Llama2::forward_batch`: several sequences at different positions in one
//! pass give each sequence the logits it gets alone (stories260K; and the
//! SmolLM2 GGUF model when `../shared` has it).

use std::path::PathBuf;

use sampler_examples::llama2::{Llama2, ModelFiles};

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Sequence `i` starts at step `start[i]` with prompt `prompts[i]` (fed one
/// token per step, then greedy): batched == alone, token for token.
fn check(model: &Llama2, prompts: &[Vec<u32>], start: &[usize], steps: usize, tol: f32) {
    let v = model.config().vocab_size;
    // Alone.
    let mut alone: Vec<Vec<Vec<f32>>> = Vec::new();
    for p in prompts {
        let mut cache = model.new_cache();
        let mut rows = Vec::new();
        let mut tok = p[0];
        for pos in 0..steps {
            let row: Vec<f32> = model
                .forward(tok, pos, &mut cache)
                .unwrap()
                .into_data()
                .iter::<f32>()
                .collect();
            tok = p.get(pos + 1).copied().unwrap_or_else(|| argmax(&row));
            rows.push(row);
        }
        alone.push(rows);
    }
    // Batched: the live sequences each step, in a rotating row order.
    let mut cache = model.new_batch_cache(prompts.len() + 1);
    let mut next: Vec<(usize, u32)> = prompts.iter().map(|p| (0, p[0])).collect();
    for step in 0..start.iter().max().unwrap() + steps {
        let mut live: Vec<usize> = (0..prompts.len())
            .filter(|&i| step >= start[i] && next[i].0 < steps)
            .collect();
        if live.is_empty() {
            continue;
        }
        let shift = step % live.len();
        live.rotate_left(shift);
        let tokens: Vec<u32> = live.iter().map(|&i| next[i].1).collect();
        let positions: Vec<usize> = live.iter().map(|&i| next[i].0).collect();
        // Slot i + 1 for sequence i: slots need not start at 0.
        let slots: Vec<usize> = live.iter().map(|&i| i + 1).collect();
        let out: Vec<f32> = model
            .forward_batch(&tokens, &positions, &slots, &mut cache)
            .unwrap()
            .into_data()
            .iter::<f32>()
            .collect();
        for (r, &i) in live.iter().enumerate() {
            let row = &out[r * v..(r + 1) * v];
            let pos = next[i].0;
            let worst = row
                .iter()
                .zip(&alone[i][pos])
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(worst < tol, "sequence {i} position {pos}: {worst}");
            let tok = prompts[i]
                .get(pos + 1)
                .copied()
                .unwrap_or_else(|| argmax(row));
            next[i] = (pos + 1, tok);
        }
    }
    assert!(next.iter().all(|&(p, _)| p == steps));
}

/// Each prompt's tokens as rows of one call (all of its positions at once),
/// the second call mixing the next prompt's chunk with the first's decoding
/// row: the logits of every position equal the one-token-at-a-time run's.
fn prompt_as_one_batch(model: &Llama2, prompts: &[Vec<u32>], tol: f32) {
    let v = model.config().vocab_size;
    let alone = |p: &[u32]| -> Vec<Vec<f32>> {
        let mut cache = model.new_cache();
        p.iter()
            .enumerate()
            .map(|(pos, &t)| {
                model
                    .forward(t, pos, &mut cache)
                    .unwrap()
                    .into_data()
                    .iter::<f32>()
                    .collect()
            })
            .collect()
    };
    let (a, b) = (&prompts[0], &prompts[prompts.len() - 1]);
    let mut cache = model.new_batch_cache(2);
    // Call 1: all of prompt a but its last token.
    let n = a.len() - 1;
    if n > 0 {
        let pos: Vec<usize> = (0..n).collect();
        let out: Vec<f32> = model
            .forward_batch(&a[..n], &pos, &vec![0; n], &mut cache)
            .unwrap()
            .into_data()
            .iter::<f32>()
            .collect();
        let want = alone(&a[..n]);
        for (i, w) in want.iter().enumerate() {
            let worst = out[i * v..(i + 1) * v]
                .iter()
                .zip(w)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            assert!(worst < tol, "prompt row {i}: {worst}");
        }
    }
    // Call 2: a's last token beside all of prompt b (slot 1).
    let mut tokens = vec![a[n]];
    let mut pos = vec![n];
    let mut slots = vec![0];
    tokens.extend_from_slice(b);
    pos.extend(0..b.len());
    slots.extend(std::iter::repeat_n(1, b.len()));
    let out: Vec<f32> = model
        .forward_batch(&tokens, &pos, &slots, &mut cache)
        .unwrap()
        .into_data()
        .iter::<f32>()
        .collect();
    let mut want = vec![alone(a)[n].clone()];
    want.extend(alone(b));
    for (i, w) in want.iter().enumerate() {
        let worst = out[i * v..(i + 1) * v]
            .iter()
            .zip(w)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < tol, "mixed row {i}: {worst}");
    }
}

#[test]
fn batched_equals_alone_stories260k() {
    let dir = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../models/stories260K"
    ));
    let (ckpt, tok) = ModelFiles::locate(&dir, None)
        .and_then(|f| f.load())
        .unwrap();
    let device = sampler_backend::parse_device("flex").unwrap();
    let model = Llama2::new(&ckpt, &device);
    let prompts: Vec<Vec<u32>> = [
        "Once upon a time",
        "The dog",
        "Lily and Tom went to the park",
    ]
    .iter()
    .map(|p| tok.encode(p, true, false))
    .collect();
    check(&model, &prompts, &[0, 3, 5], 24, 1e-4);
    prompt_as_one_batch(&model, &prompts, 1e-4);
    // Errors, not panics: a slot twice, a slot outside the cache.
    let mut cache = model.new_batch_cache(2);
    assert!(
        model
            .forward_batch(&[1, 1], &[0, 0], &[0, 0], &mut cache)
            .is_err()
    );
    assert!(model.forward_batch(&[1], &[0], &[2], &mut cache).is_err());
    assert!(
        model
            .forward_batch(&[1], &[10_000], &[0], &mut cache)
            .is_err()
    );
}

#[test]
fn batched_equals_alone_smollm2() {
    let path = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
    ));
    if !path.is_file() {
        println!(
            "SKIP: {} is absent (the shared model directory beside the repository)",
            path.display()
        );
        return;
    }
    let g = sampler_examples::gguf::Gguf::read(&path).unwrap();
    let ckpt = sampler_examples::gguf::llama_checkpoint(&g, 64).unwrap();
    let device = sampler_backend::parse_device("flex").unwrap();
    let model = Llama2::new(&ckpt, &device);
    check(
        &model,
        &[vec![1], vec![6403, 1980, 253, 655]],
        &[0, 2],
        8,
        1e-3,
    );
}
