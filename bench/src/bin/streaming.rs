//! Would a crowd keep its progress a round if a worker's next phase overlapped the link?
//! Streaming DiLoCo's overlap (Douillard et al., arXiv 2501.18512), emulated round by round
//! before anything is built: no link, no checks, no coordinator, every gradient computed for
//! real. Each of `--workers` workers trains its shard of the crowd's corpus (the
//! coordinator's shards and batches), and the outer step is the coordinator's optimizer on
//! the mean answer.
//!
//! - `--tau 0`: DiLoCo as the coordinator runs it: every phase starts from the newest
//!   weights. At four workers it reaches 2.0 in the crowd's rounds (docs/BENCHMARKS.md).
//! - `--tau τ`: a worker starts its next phase the moment it answers, from its own end
//!   (`--from end`) or from the weights it was last sent (`--from last`), takes `τ` steps
//!   while its answer goes up and the aggregate comes down, then mixes the newest weights in
//!   (`α·own + (1 − α)·newest`, `--alpha`), takes the phase's other `H − τ` steps (its inner
//!   optimizer's moments go on across the mix) and answers against the newest weights. The
//!   outer step sees no delay; a round is the phase alone, where without overlap it is the
//!   phase and the link.
//!
//! - `--up-levels L`: answers rounded on the wire as the protocol's scaled encodings round
//!   them (`int4` is 7, `int2` 1); `--down-levels L`: the weights as the coordinator's chain
//!   of deltas sends them (each delta at `L`, the sum held through `int8`; the crowd's is 7),
//!   every phase starting from what the workers hold.
//!
//! - `--up-keep K`: sparse answers with error feedback (SparseLoCo, arXiv 2508.15706): of
//!   each chunk of the answer plus the worker's residual, the `K` largest in magnitude go up
//!   (rounded at `--up-levels` of the kept ones' largest, if set), and what did not go up is
//!   the residual carried into the next answer. The bytes count each kept value's level and
//!   its index in the chunk, and a 2-byte scale a chunk.
//!
//! - `--eager own|mixed`: one-round-delayed overlap with eager updates (Kale, Douillard and
//!   Donchev, arXiv 2502.12996), as a parameter server would run it. A worker answers and at
//!   once starts its next phase, before the round's aggregate exists: from the outer step
//!   the coordinator will take on the weights this phase started near, with a stand-in for
//!   the aggregate (`own`: the worker's own answer; `mixed`: the paper's, the last
//!   aggregate with the worker's own share of it replaced by its fresh answer). The
//!   coordinator applies every round's mean answer to the weights of that round, with no
//!   delay; what the overlap costs is that each phase started from a guess of them. The
//!   start is a function of what the coordinator holds (every version, its optimizer, each
//!   answer as decoded), so a phase stays replayable. A round is then the phase alone
//!   where the link is shorter than it.
//!
//! It prints one JSON line a round (the validation loss, and the megabytes both ways at
//! those levels) and a last one with the rounds to `--target-loss`; time is the caller's to
//! put on them: rounds × (phase, or phase + link).

use std::ops::Range;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use model::{
    assign_shards, batch_positions, batch_seed, Dataset, LocalPhase, ModelError, Network,
    OptimizerKind,
};
use serde_json::json;

#[derive(Parser, Debug)]
struct Cli {
    /// Workers.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Steps a worker takes before the newest weights land (0: no overlap).
    #[arg(long, default_value_t = 0)]
    tau: u32,
    /// The worker's own weights' share in the mix.
    #[arg(long, default_value_t = 0.5)]
    alpha: f32,
    /// Where the overlapped steps start.
    #[arg(long, value_enum, default_value_t = Start::End)]
    from: Start,
    /// Stop at this validation loss.
    #[arg(long, default_value_t = 2.0)]
    target_loss: f64,
    /// Stop after this many rounds.
    #[arg(long, default_value_t = 120)]
    max_rounds: u64,
    /// The coordinator's flags, as `crowd` takes them: its model, batch and optimizers, and
    /// the phase's steps (`--local-steps H`, a number), e.g.
    /// `--coordinator "--model gpt --batch-size 12 --local-steps 16"`.
    #[arg(
        long,
        default_value = "--model gpt --batch-size 12 --local-steps 16",
        allow_hyphen_values = true
    )]
    coordinator: String,
    /// The wire: an answer's levels each side of zero per chunk (`scale = max|x| / L`, as
    /// the protocol's `int4` is 7 over 64 values); 0 sends it exact.
    #[arg(long, default_value_t = 0)]
    up_levels: u8,
    /// The weights' wire: a worker holds `settle(held + Q(W - held))`, the delta `Q` at these
    /// levels per chunk and the sum through `int8` (the coordinator's chain at 7); 0 sends
    /// the newest weights exact.
    #[arg(long, default_value_t = 0)]
    down_levels: u8,
    /// Sparse answers: the values of each chunk that go up, with error feedback (0: all).
    #[arg(long, default_value_t = 0)]
    up_keep: usize,
    /// Values per chunk that share a scale, both ways.
    #[arg(long, default_value_t = 64)]
    chunk: usize,
    /// One-round-delayed overlap with eager updates (see above); `off` waits for the link.
    #[arg(long, value_enum, default_value_t = Eager::Off)]
    eager: Eager,
    /// Under `--eager own`, the share of its answer that stands in for the aggregate: below
    /// 1 the start is less noisy and lags the weights by the rest of the outer step.
    #[arg(long, default_value_t = 1.0)]
    eager_share: f32,
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

/// What stands in for the round's aggregate when a worker starts its next phase early.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Eager {
    /// No overlap: the next phase starts from the newest weights.
    Off,
    /// The worker's own answer.
    Own,
    /// The last aggregate, the worker's share of it replaced by its fresh answer (the
    /// paper's `Δ_i/M + Σ_{j≠i} Δ_j^{late}/M`).
    Mixed,
}

/// The stand-in for the aggregate that worker `fresh` starts its next phase from: `share`
/// of its answer, or the last mean with its own share of it (`last_own`) replaced by `fresh`.
fn stand_in(
    eager: Eager,
    share: f32,
    fresh: &[f32],
    last_mean: &[f32],
    last_own: &[f32],
    m: usize,
) -> Vec<f32> {
    match eager {
        Eager::Off | Eager::Own => fresh.iter().map(|f| share * f).collect(),
        Eager::Mixed => {
            let m = m as f32;
            fresh
                .iter()
                .zip(last_mean)
                .zip(last_own)
                .map(|((f, l), o)| l + (f - o) / m)
                .collect()
        }
    }
}

/// `values` rounded to `levels` steps each side of zero of their chunk's largest (half away
/// from zero): the protocol's `int4` at 7 over 64, `int2` at 1 over 64 (its scale through a
/// bfloat16), `int8` at 127 over 256.
fn rounded(values: &[f32], levels: u8, chunk: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(values.len());
    for c in values.chunks(chunk) {
        let scale = c.iter().fold(0.0f32, |m, x| m.max(x.abs())) / f32::from(levels);
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        let l = f32::from(levels);
        // int2's ±1 carry its scale through a bfloat16 (protocol 15); the others an f32.
        let magnitude = if levels == 1 {
            protocol::tensor::int2_scale(scale)
        } else {
            scale
        };
        out.extend(c.iter().map(|x| (x * inv).round().clamp(-l, l) * magnitude));
    }
    out
}

/// The bits a value takes at `levels` each side of zero (its chunk's scale aside); 32 exact.
/// Dense: the wire's `int2` (1 level), packed by its zeros since protocol 13, takes fewer
/// (a bit a value and a sign bit a nonzero one), so at 1 this is its most.
fn bits_a_value(levels: u8) -> f64 {
    if levels == 0 {
        32.0
    } else {
        f64::from(u32::from(levels) * 2 + 1).log2().ceil()
    }
}

/// The `keep` largest in magnitude of each chunk of `values`, rounded at `levels` of the
/// kept ones' largest (exact at 0), the others zero: the sparse answer that goes up.
fn sparse(values: &[f32], keep: usize, levels: u8, chunk: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; values.len()];
    let mut order: Vec<usize> = Vec::with_capacity(chunk);
    for (src, dst) in values.chunks(chunk).zip(out.chunks_mut(chunk)) {
        order.clear();
        order.extend(0..src.len());
        // Ties broken by position, so the choice is a function of the values alone.
        order.sort_by(|&a, &b| src[b].abs().total_cmp(&src[a].abs()).then(a.cmp(&b)));
        order.truncate(keep);
        let kept: Vec<f32> = order.iter().map(|&i| src[i]).collect();
        let kept = if levels > 0 {
            rounded(&kept, levels, kept.len().max(1))
        } else {
            kept
        };
        for (&i, v) in order.iter().zip(kept) {
            dst[i] = v;
        }
    }
    out
}

/// Where a worker's overlapped steps start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Start {
    /// Its own end, where its last phase ended.
    End,
    /// The weights its last phase started from.
    Last,
}

/// How a phase overlaps the link.
#[derive(Debug, Clone, Copy)]
struct Overlap {
    tau: u32,
    alpha: f32,
    from: Start,
}

/// What every phase takes: its inner optimizer, its batch and its steps.
#[derive(Debug, Clone, Copy)]
struct Recipe {
    inner: OptimizerKind,
    batch: usize,
    steps: u32,
}

/// One worker: its shard, the next batch index, and where its last phase ended.
struct Worker {
    shard: Dataset,
    first_index: usize,
    batch: u64,
    end: Option<Vec<f32>>,
    /// What its sparse answers have not sent yet (error feedback).
    residual: Vec<f32>,
    /// Under `--eager`: where its next phase starts, and its last answer.
    start: Option<Vec<f32>>,
    last_answer: Vec<f32>,
}

impl Worker {
    fn new(train: &Dataset, range: Range<usize>) -> Self {
        Self {
            shard: train.slice(range.clone()),
            first_index: range.start,
            batch: 0,
            end: None,
            residual: Vec::new(),
            start: None,
            last_answer: Vec::new(),
        }
    }

    /// Its phase for the round whose weights are `theta` (`before`: the round before's, if
    /// there was one): its answer, `theta` minus where it ended.
    fn phase(
        &mut self,
        net: &Network,
        recipe: Recipe,
        theta: &[f32],
        before: Option<&[f32]>,
        overlap: Overlap,
    ) -> Result<Vec<f32>, ModelError> {
        let overlapped = match (overlap.tau > 0, overlap.from) {
            (false, _) => None,
            (true, Start::End) => self.end.as_deref(),
            (true, Start::Last) => before,
        };
        let mixes = overlapped.is_some();
        let mut phase =
            LocalPhase::new(net, overlapped.unwrap_or(theta), recipe.inner, recipe.steps);
        for k in 0..recipe.steps {
            if mixes && k == overlap.tau {
                let (step, mut state) = phase.flat_state();
                for (x, t) in state.iter_mut().zip(theta) {
                    *x = overlap.alpha * *x + (1.0 - overlap.alpha) * t;
                }
                phase.adopt(&[], step, &state)?;
            }
            let positions = batch_positions(self.shard.len(), self.batch, recipe.batch);
            let (x, labels) = self.shard.batch(positions);
            phase.step(
                net,
                x.view(),
                &labels,
                batch_seed(self.batch, self.first_index),
            )?;
            self.batch += 1;
        }
        let end = phase.weights(net).into_owned();
        let answer = theta.iter().zip(&end).map(|(t, e)| t - e).collect();
        self.end = Some(end);
        Ok(answer)
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let seed = cli.seed.to_string();
    let args = ["coordinator", "--seed", &seed, "--host", "0.0.0.0"]
        .into_iter()
        .chain(cli.coordinator.split_whitespace());
    let parsed = server::config::Cli::try_parse_from(args)
        .map_err(|e| anyhow::anyhow!("--coordinator: {e}"))?;
    let config = server::config::Config::try_from(parsed)?;
    let local = config
        .training
        .local
        .as_ref()
        .context("--coordinator: local phases (--local-steps) are what this emulates")?;
    let steps = match local.steps {
        coordinator_core::LocalSteps::Fixed(h) => h,
        _ => anyhow::bail!("--coordinator: --local-steps must be a number of steps here"),
    };
    let overlap = Overlap {
        tau: cli.tau,
        alpha: cli.alpha,
        from: cli.from,
    };
    if overlap.tau >= steps {
        anyhow::bail!(
            "--tau {} must be below the phase's {steps} steps",
            overlap.tau
        );
    }
    if cli.eager != Eager::Off && (overlap.tau > 0 || cli.down_levels > 0 || cli.up_keep > 0) {
        anyhow::bail!("--eager: with exact weights down and dense answers, and no --tau");
    }
    let split = config.load_data(cli.seed)?;
    let net = split.network(&config.model)?;
    if !net.frozen().is_empty() {
        // The mix takes the phase's trained tensors for the whole weights.
        anyhow::bail!("--coordinator: a model with frozen layers is not emulated here");
    }
    let recipe = Recipe {
        inner: local.inner,
        batch: config.training.batch_size as usize,
        steps,
    };
    let mut theta: Vec<f32> = net.init(cli.seed);
    // The round before's weights, where `--from last` starts the overlapped steps.
    let mut before: Option<Vec<f32>> = None;
    let mut outer = config
        .training
        .optimizer
        .build_masked(theta.len(), net.decayed());
    let mut workers: Vec<Worker> = assign_shards(cli.workers, split.train.len())
        .into_iter()
        .map(|range| Worker::new(&split.train, range))
        .collect();
    println!(
        "{}",
        json!({"workers": cli.workers, "steps": steps, "tau": overlap.tau, "alpha": overlap.alpha,
               "from": format!("{:?}", overlap.from), "inner": format!("{:?}", recipe.inner),
               "outer": format!("{:?}", config.training.optimizer), "batch": recipe.batch,
               "up_levels": cli.up_levels, "down_levels": cli.down_levels, "up_keep": cli.up_keep,
               "eager": format!("{:?}", cli.eager), "eager_share": cli.eager_share})
    );
    let mut reached = None;
    // What the workers hold, where the weights go as deltas.
    let mut held: Option<Vec<f32>> = None;
    let mut bytes = 0.0f64;
    // The last round's mean answer, where `--eager mixed` takes the others' share.
    let mut last_mean: Option<Vec<f32>> = None;
    // Bytes a value each way, the same every round.
    let down_bytes = bits_a_value(cli.down_levels) / 8.0;
    let up_bytes = if cli.up_keep > 0 {
        // Each kept value's level and its index in the chunk, and a 2-byte scale a chunk.
        let (kept, chunk) = (cli.up_keep.min(cli.chunk) as f64, cli.chunk as f64);
        (kept * (bits_a_value(cli.up_levels) + chunk.log2().ceil()) / 8.0 + 2.0) / chunk
    } else {
        bits_a_value(cli.up_levels) / 8.0
    };
    for round in 1..=cli.max_rounds {
        if cli.down_levels > 0 {
            let next = match &held {
                None => rounded(&theta, 127, 256),
                Some(h) => {
                    let d: Vec<f32> = theta.iter().zip(h).map(|(t, h)| t - h).collect();
                    let d = rounded(&d, cli.down_levels, cli.chunk);
                    let sum: Vec<f32> = h.iter().zip(&d).map(|(h, d)| h + d).collect();
                    rounded(&sum, 127, 256)
                }
            };
            held = Some(next);
        }
        let start = held.as_ref().unwrap_or(&theta);
        let answers = std::thread::scope(|s| {
            let handles: Vec<_> = workers
                .iter_mut()
                .map(|w| {
                    let (net, before) = (&net, before.as_deref());
                    let own = w.start.take();
                    s.spawn(move || {
                        w.phase(
                            net,
                            recipe,
                            own.as_deref().unwrap_or(start),
                            before,
                            overlap,
                        )
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a phase panicked"))
                .collect::<Result<Vec<_>, _>>()
        })?;
        let answers: Vec<Vec<f32>> = if cli.up_keep > 0 {
            answers
                .into_iter()
                .zip(workers.iter_mut())
                .map(|(a, w)| {
                    let carried: Vec<f32> = if w.residual.is_empty() {
                        a
                    } else {
                        a.iter().zip(&w.residual).map(|(a, r)| a + r).collect()
                    };
                    let sent = sparse(&carried, cli.up_keep, cli.up_levels, cli.chunk);
                    w.residual = carried.iter().zip(&sent).map(|(c, s)| c - s).collect();
                    sent
                })
                .collect()
        } else if cli.up_levels > 0 {
            answers
                .iter()
                .map(|a| rounded(a, cli.up_levels, cli.chunk))
                .collect()
        } else {
            answers
        };
        bytes += workers.len() as f64 * theta.len() as f64 * (up_bytes + down_bytes);
        let mut mean = vec![0.0f32; theta.len()];
        for answer in &answers {
            for (m, v) in mean.iter_mut().zip(answer) {
                *m += v / answers.len() as f32;
            }
        }
        if cli.eager != Eager::Off {
            // Each worker's next start: the outer step on this round's weights with its
            // stand-in for the mean, on a copy of the coordinator's optimizer.
            let state = outer.state();
            let zeros = vec![0.0f32; theta.len()];
            let last_mean = last_mean.as_deref().unwrap_or(&zeros);
            let m = workers.len();
            let mut peek = config
                .training
                .optimizer
                .build_masked(theta.len(), net.decayed());
            for (w, answer) in workers.iter_mut().zip(&answers) {
                let last_own = if w.last_answer.is_empty() {
                    &zeros
                } else {
                    &w.last_answer
                };
                let proxy = stand_in(cli.eager, cli.eager_share, answer, last_mean, last_own, m);
                peek.restore(state.clone())
                    .map_err(|e| anyhow::anyhow!("the outer optimizer's state: {e}"))?;
                let mut next = theta.clone();
                peek.step(&mut next, &proxy);
                w.start = Some(next);
                w.last_answer.clone_from(answer);
            }
        }
        before = Some(theta.clone());
        outer.step(&mut theta, &mean);
        last_mean = Some(mean);
        let loss = model::evaluate(&net, &theta, &split.test)?.loss;
        println!(
            "{}",
            json!({"round": round, "loss": loss, "mbytes": bytes / 1e6})
        );
        if loss <= cli.target_loss {
            reached = Some(round);
            break;
        }
    }
    println!("{}", json!({"reached_round": reached}));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADAMW: OptimizerKind = OptimizerKind::AdamW {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        weight_decay: 0.1,
    };

    fn setup() -> (Network, Dataset, Vec<f32>) {
        let net = Network::mlp(&[4, 8, 3]).expect("an MLP");
        let pixels = (0..4 * 40).map(|i| (i * 37 % 251) as u8).collect();
        let labels = (0..40).map(|i| (i * 7 % 3) as u8).collect();
        let data = Dataset::new(4, pixels, labels).expect("a dataset");
        let theta = net.init(3);
        (net, data, theta)
    }

    /// A plain phase of `steps` from `start` on the worker's batches `first..`: its end.
    fn plain(net: &Network, w: &Worker, start: &[f32], first: u64, steps: u32) -> Vec<f32> {
        let mut phase = LocalPhase::new(net, start, ADAMW, steps);
        for b in first..first + u64::from(steps) {
            let (x, labels) = w.shard.batch(batch_positions(w.shard.len(), b, 5));
            phase
                .step(net, x.view(), &labels, batch_seed(b, w.first_index))
                .expect("a step");
        }
        phase.weights(net).into_owned()
    }

    /// The wire's rounding is the protocol's: int4 at 7 levels, int2 at 1, int8 at 127 over
    /// 256 (away from the encodings' ties, where `f32::round` and the codec agree anyway).
    #[test]
    fn rounded_is_the_protocols_scaled_encodings() {
        use protocol::tensor::{decode_payload, encode_payload};
        use protocol::Compression;
        let values: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919 % 1009) as f32 / 504.5 - 1.0).powi(3) * 0.01)
            .collect();
        for (c, levels, chunk) in [
            (Compression::Int4, 7, 64),
            (Compression::Int2, 1, 64),
            (Compression::Int8, 127, 256),
        ] {
            let mut raw = Vec::new();
            encode_payload(&mut raw, &values, c);
            assert_eq!(
                rounded(&values, levels, chunk),
                decode_payload(&raw, values.len(), c),
                "{c:?}"
            );
        }
    }

    /// The paper's stand-in swaps the worker's late share of the mean for its fresh answer;
    /// alone, a worker's mean is its own answer, so it is that answer.
    #[test]
    fn the_mixed_stand_in_replaces_the_workers_share_of_the_last_mean() {
        let (a_late, b_late) = ([1.0f32, -2.0], [3.0f32, 4.0]);
        let last_mean = [2.0f32, 1.0];
        let fresh = [5.0f32, 0.0];
        let got = stand_in(Eager::Mixed, 1.0, &fresh, &last_mean, &a_late, 2);
        // (fresh + b's late answer) / 2
        let want: Vec<f32> = fresh
            .iter()
            .zip(&b_late)
            .map(|(f, b)| (f + b) / 2.0)
            .collect();
        assert_eq!(got, want);
        assert_eq!(
            stand_in(Eager::Own, 1.0, &fresh, &last_mean, &a_late, 2),
            fresh
        );
        assert_eq!(
            stand_in(Eager::Own, 0.5, &fresh, &last_mean, &a_late, 2),
            [2.5, 0.0]
        );
        assert_eq!(
            stand_in(Eager::Mixed, 1.0, &fresh, &a_late, &a_late, 1),
            fresh
        );
    }

    /// The bytes counted are the protocol's: int4 in 4 bits, int2 in 2, int8 in 8, f32 in 32.
    #[test]
    fn a_values_bits_are_the_encodings() {
        let bits: Vec<f64> = [7, 1, 127, 0].into_iter().map(bits_a_value).collect();
        assert_eq!(bits, [4.0, 2.0, 8.0, 32.0]);
    }

    /// A sparse answer keeps each chunk's `keep` largest, exact at 0 levels and on the
    /// kept ones' scale otherwise, and nothing else.
    #[test]
    fn sparse_keeps_each_chunks_largest() {
        let values: Vec<f32> = (0..200)
            .map(|i| ((i * 7919 % 1009) as f32 / 504.5 - 1.0) * 0.01)
            .collect();
        let kept = sparse(&values, 4, 0, 64);
        for (src, out) in values.chunks(64).zip(kept.chunks(64)) {
            let nonzero: Vec<usize> = (0..src.len()).filter(|&i| out[i] != 0.0).collect();
            assert_eq!(nonzero.len(), 4.min(src.len()));
            let least = nonzero
                .iter()
                .map(|&i| src[i].abs())
                .fold(f32::MAX, f32::min);
            for i in 0..src.len() {
                if nonzero.contains(&i) {
                    assert_eq!(out[i], src[i], "kept exactly");
                } else {
                    assert!(src[i].abs() <= least, "a larger one left out");
                }
            }
        }
        let two = sparse(&values, 4, 1, 64);
        for (src, out) in kept.chunks(64).zip(two.chunks(64)) {
            let top = src.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let top = protocol::tensor::int2_scale(top);
            for (s, o) in src.iter().zip(out) {
                assert!(
                    *o == 0.0 || o.abs() == top,
                    "three levels of the kept ones' largest (through a bfloat16)"
                );
                assert!(*s != 0.0 || *o == 0.0, "only kept values go up");
            }
        }
    }

    fn minus(a: &[f32], b: &[f32]) -> Vec<f32> {
        a.iter().zip(b).map(|(x, y)| x - y).collect()
    }

    /// Without overlap a phase is the coordinator's: from the newest weights, answered
    /// with them minus its end; with it, the mix's ends are the worker's own trajectory
    /// (`α = 1`) and a phase whose weights are the newest from step `τ` on (`α = 0`).
    #[test]
    fn a_phase_is_dilocos_without_overlap_and_mixes_at_tau_with_it() {
        let (net, data, theta) = setup();
        let next: Vec<f32> = theta.iter().map(|t| t + 1.0).collect();
        let none = Overlap {
            tau: 0,
            alpha: 0.5,
            from: Start::End,
        };
        let recipe = Recipe {
            inner: ADAMW,
            batch: 5,
            steps: 6,
        };
        let mut w = Worker::new(&data, 0..40);
        let first = w.phase(&net, recipe, &theta, None, none).expect("a phase");
        let end = plain(&net, &w, &theta, 0, 6);
        assert_eq!(first, minus(&theta, &end), "DiLoCo's answer");
        let own = Overlap {
            tau: 2,
            alpha: 1.0,
            from: Start::End,
        };
        let mut kept = Worker::new(&data, 0..40);
        kept.phase(&net, recipe, &theta, None, none)
            .expect("a phase");
        let answer = kept
            .phase(&net, recipe, &next, Some(&theta), own)
            .expect("a phase");
        assert_eq!(
            answer,
            minus(&next, &plain(&net, &w, &end, 6, 6)),
            "α = 1: the worker's own trajectory, answered against the newest weights"
        );
        let newest = Overlap { alpha: 0.0, ..own };
        let mut mixed = Worker::new(&data, 0..40);
        mixed
            .phase(&net, recipe, &theta, None, none)
            .expect("a phase");
        let answer = mixed
            .phase(&net, recipe, &next, Some(&theta), newest)
            .expect("a phase");
        let moved = plain(&net, &w, &next, 8, 4);
        assert_ne!(
            answer,
            minus(&next, &moved),
            "α = 0 keeps the moments of the steps before the mix"
        );
        assert!(
            answer
                .iter()
                .zip(minus(&next, &moved))
                .all(|(a, b)| (a - b).abs() < 0.2),
            "but its weights start again from the newest"
        );
        let last = Overlap {
            from: Start::Last,
            ..own
        };
        let mut again = Worker::new(&data, 0..40);
        again
            .phase(&net, recipe, &theta, None, none)
            .expect("a phase");
        let answer = again
            .phase(&net, recipe, &next, Some(&theta), last)
            .expect("a phase");
        assert_eq!(
            answer,
            minus(&next, &plain(&net, &w, &theta, 6, 6)),
            "--from last: from the round before's weights"
        );
    }
}
