//! `drift`: how far a GPT's local phase computed in another float order ends from the
//! coordinator's replay of it, tensor by tensor: what a GPU's phase would be checked
//! against (docs/BENCHMARKS.md#a-tabs-gpu).
//!
//! The model is trained `--trained` AdamW steps first (in the coordinator's order); then,
//! from there, phases of each `--steps` length start at `--phases` batch indices. Each is
//! taken twice: with every step's gradient computed in f64 and rounded (another order, as
//! a GPU's is), and as the coordinator replays it (`Order::Library`, f32). Prints one JSON
//! line a phase length: the distance of the pseudo-gradients' worst tensor, as a share of
//! its norm, at the median, the 99th percentile and the worst phase, the keys' bias (inert,
//! `model/src/gpt/tests.rs`) apart, and the keys' bias's largest difference. `--segment k`
//! compares segments of k steps, each replayed from the other order's own state.
//!
//! `drift --coordinator "--model gpt --gpt-layers 1 --gpt-heads 2 --gpt-width 32 --context
//! 16" --batch-size 32 --trained 100 --steps 4,16 --phases 50`

use anyhow::Context;
use clap::Parser;
use model::{batch_positions, batch_seed, with_order, LocalPhase, OptimizerKind, Order};

#[derive(Debug, Parser)]
#[command(name = "drift")]
struct Cli {
    /// The coordinator's flags naming the model and its data, as one string.
    #[arg(long, default_value = "--model gpt", allow_hyphen_values = true)]
    coordinator: String,
    #[arg(long, default_value_t = 12)]
    batch_size: usize,
    /// AdamW steps taken before the phases start.
    #[arg(long, default_value_t = 100)]
    trained: u32,
    /// Phase lengths.
    #[arg(long, value_delimiter = ',', default_value = "4,16")]
    steps: Vec<u32>,
    /// Phases of each length, each from its own batch.
    #[arg(long, default_value_t = 50)]
    phases: u64,
    /// AdamW's learning rate (β 0.9/0.99, decay 0.1, as a GPT's inner phases).
    #[arg(long, default_value_t = 1e-3)]
    lr: f32,
    /// Segments of this many steps instead: each replayed from the other order's own
    /// state at its start (weights and Adam's moments), against that order's state at its
    /// end (the design in docs/DESIGN.md#a-gpus-local-phase-checked-not-yet-built).
    #[arg(long)]
    segment: Option<u32>,
}

/// Each tensor's distance between two deltas as a share of `b`'s norm, the keys' bias
/// (inert) apart from the rest of `c_attn.bias`: the worst tensor's, and the keys' bias's
/// largest difference (absolute: its delta is rounding alone, and may be zero).
fn distances<'a>(gpt: &'a model::gpt::Gpt, a: &[f32], b: &[f32]) -> (f64, &'a str, f64) {
    let c = gpt.spec().width;
    let (mut keys, mut live) = (0.0f64, (0.0f64, ""));
    for t in gpt.layout().tensors() {
        let range = t.range();
        let parts = if t.name.ends_with("attn.c_attn.bias") {
            vec![
                (range.start + c..range.start + 2 * c, true),
                (range.start..range.start + c, false),
                (range.start + 2 * c..range.end, false),
            ]
        } else {
            vec![(range, false)]
        };
        for (range, inert) in parts {
            let (mut off, mut norm, mut most) = (0f64, 0f64, 0f64);
            for (x, y) in a[range.clone()].iter().zip(&b[range]) {
                off += f64::from(x - y).powi(2);
                norm += f64::from(*y).powi(2);
                most = most.max(f64::from(x - y).abs());
            }
            let d = if off == 0.0 {
                0.0
            } else {
                off.sqrt() / norm.sqrt()
            };
            if inert {
                keys = keys.max(most);
            } else if d > live.0 {
                live = (d, t.name.as_str());
            }
        }
    }
    (live.0, live.1, keys)
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let args = ["coordinator"]
        .into_iter()
        .chain(cli.coordinator.split_whitespace());
    let config = server::config::Config::try_from(
        server::config::Cli::try_parse_from(args)
            .map_err(|e| anyhow::anyhow!("--coordinator: {e}"))?,
    )?;
    let split = config.load_data(1)?;
    let net = split.network(&config.model)?;
    let gpt = net.as_gpt().context("--coordinator: a GPT (--model gpt)")?;
    let (train, batch) = (&split.train, cli.batch_size);
    let adamw = OptimizerKind::AdamW {
        lr: cli.lr,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let init: Vec<f32> = net.init(1);
    let mut warm = LocalPhase::new(&net, &init, adamw, cli.trained);
    for k in 0..u64::from(cli.trained) {
        let (x, labels) = train.batch(batch_positions(train.len(), k, batch));
        warm.step(&net, x.view(), &labels, batch_seed(k, 0))?;
    }
    let start: Vec<f32> = init
        .iter()
        .zip(&warm.finish().delta)
        .map(|(w, d)| w - d)
        .collect();
    for &steps in &cli.steps {
        let mut worst = Vec::new();
        for phase in 0..cli.phases {
            let first = 1_000 + 37 * phase;
            if let Some(k) = cli.segment {
                worst.extend(segments(
                    &net,
                    train,
                    batch,
                    adamw,
                    &start,
                    (first, steps),
                    k,
                )?);
                continue;
            }
            let mut other = LocalPhase::new(&net, &start, adamw, steps);
            let mut replay = LocalPhase::new(&net, &start, adamw, steps);
            for k in first..first + u64::from(steps) {
                let (x, labels) = train.batch(batch_positions(train.len(), k, batch));
                let seed = batch_seed(k, 0);
                let wide: Vec<f64> = other.weights(&net).iter().map(|&v| f64::from(v)).collect();
                let (loss, g) =
                    net.loss_and_grad(&wide, x.mapv(f64::from).view(), &labels, seed)?;
                let g: Vec<f32> = g.into_iter().map(|v| v as f32).collect();
                other.apply(&net, loss as f32, &g);
                with_order(Order::Library, || {
                    replay.step(&net, x.view(), &labels, seed)
                })?;
            }
            let (other, replay) = (other.finish().delta, replay.finish().delta);
            let (live, name, keys) = distances(gpt, &other, &replay);
            worst.push((live, name, keys));
        }
        worst.sort_by(|a, b| a.0.total_cmp(&b.0));
        let at = |q: usize| worst[(worst.len() - 1) * q / 100];
        let keys = worst.iter().map(|w| w.2).fold(0.0, f64::max);
        println!(
            "{}",
            serde_json::json!({
                "model": net.spec().to_string(),
                "batch_size": batch,
                "trained": cli.trained,
                "steps": steps,
                "segment": cli.segment,
                "compared": worst.len(),
                "median": at(50).0,
                "p99": at(99).0,
                "worst": at(100).0,
                "worst_tensor": at(100).1,
                "key_bias_largest": keys,
            })
        );
    }
    Ok(())
}

/// A phase of `steps` from batch `first` in the other order (f64 gradients), cut in
/// segments of `k`: each replayed from that order's own state at its start (weights and
/// the optimizer's moments), its delta against the other order's over the segment.
fn segments<'a>(
    net: &'a model::Network,
    train: &model::Dataset,
    batch: usize,
    optimizer: OptimizerKind,
    start: &[f32],
    (first, steps): (u64, u32),
    k: u32,
) -> anyhow::Result<Vec<(f64, &'a str, f64)>> {
    let gpt = net.as_gpt().context("a GPT")?;
    let batch_at = |i: u64| train.batch(batch_positions(train.len(), i, batch));
    let mut weights = start.to_vec();
    let mut other = optimizer.build_masked(weights.len(), net.decayed_trained());
    let mut out = Vec::new();
    for segment in 0..steps / k {
        let (at, state) = (weights.clone(), other.state());
        let mut replayed = at.clone();
        let mut replay = optimizer.build_masked(weights.len(), net.decayed_trained());
        replay.restore(state)?;
        for i in 0..u64::from(k) {
            let index = first + u64::from(segment * k) + i;
            let (x, labels) = batch_at(index);
            let seed = batch_seed(index, 0);
            let wide: Vec<f64> = weights.iter().map(|&v| f64::from(v)).collect();
            let (_, g) = net.loss_and_grad(&wide, x.mapv(f64::from).view(), &labels, seed)?;
            let g: Vec<f32> = g.into_iter().map(|v| v as f32).collect();
            other.step(&mut weights, &g);
            let (_, g) = with_order(Order::Library, || {
                net.loss_and_grad(&replayed, x.view(), &labels, seed)
            })?;
            replay.step(&mut replayed, &g);
        }
        let delta = |end: &[f32]| -> Vec<f32> { at.iter().zip(end).map(|(a, e)| a - e).collect() };
        out.push(distances(gpt, &delta(&replayed), &delta(&weights)));
    }
    Ok(out)
}
