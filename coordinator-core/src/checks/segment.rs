//! One segment of a local phase computed in an order nobody can replay (a GPU's), checked
//! from the states the worker revealed at its two ends: replayed from the start state
//! (weights and the inner optimizer's moments) in the coordinator's order, and compared
//! with the end state tensor by tensor (docs/DESIGN.md#a-gpus-local-phase-checked-by-segments).
//!
//! This is the check a challenge runs ([`super::challenge`]). Its tolerances are
//! calibrated by `target/release/drift --segment` (docs/BENCHMARKS.md#a-tabs-gpu).
//!
//! - A segment starts with Adam's moments already built, so the first step's whole-rate
//!   amplification of a fresh optimizer is not in it: honest segments of 4 and 8 steps
//!   drifted 2.9e-5 of a tensor's norm at the 99th percentile, 2.2e-4 at worst in 480.
//! - An **Adam tie** is a value whose second moment is near rounding (its gradient is, as
//!   the keys' bias's always is): Adam divides by its root, so rounding picks its steps.
//!   Each may end [`ADAM_STEP`] learning rates a step away, and counts in no tensor.
//! - The moments are compared as the weights are: the next segment starts from them.
//! - Between [`SEGMENT_TENSOR`] and [`MARGINAL`] times it, a segment is marginal: the
//!   challenge asks for the segments beside it rather than striking.

use model::OptimizerState;
use model::{batch_positions, batch_seed, with_order, Dataset, ModelError, Network, Order};

use super::verify::Batches;

/// Each tensor's distance from the replay (weights' delta over the segment, and each
/// moment), as a share of its norm (4.5 times the worst honest segment measured).
pub const SEGMENT_TENSOR: f64 = 1e-3;
/// Beyond this many times [`SEGMENT_TENSOR`], a mismatch; up to it, marginal.
pub const MARGINAL: f64 = 4.0;
/// The most one Adam step moves a value, in learning rates, with room: `(1 − β1) /
/// √(1 − β2)` (Kingma and Ba, 2.1), 1 at β 0.9/0.99 and 3.2 at 0.9/0.999.
pub const ADAM_STEP: f32 = 4.0;
/// An Adam tie: the root of its second moment below this share of its tensor's mean root.
const TIE: f32 = 1e-3;
/// Rounding's floor, a value (as the verifier's).
const ABS: f64 = 1e-6;

/// A worker's state at a segment's end: its weights (full layout) and its inner
/// optimizer's state.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    pub weights: Vec<f32>,
    pub optimizer: OptimizerState,
}

/// What the segment was: its batches (the first step's, in one part) and how many steps
/// of which inner optimizer.
#[derive(Debug, Clone)]
pub struct Segment {
    pub batches: Batches,
    pub steps: u32,
    pub optimizer: protocol::InnerOptimizer,
}

/// How a segment compares with its replay.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Matches,
    /// Outside [`SEGMENT_TENSOR`], within [`MARGINAL`] times it: check the neighbours.
    Marginal(Outside),
    /// Beyond that, or a revealed state that does not fit the model or its optimizer.
    Mismatch(Outside),
}

/// The worst part of a segment: which tensor of what, how far, and how far it may be.
#[derive(Debug, Clone, PartialEq)]
pub struct Outside {
    /// `weights`, `m` or `v`, or what in a revealed state does not fit.
    pub what: String,
    /// The tensor's name, or the tie's index.
    pub tensor: String,
    pub distance: f64,
    pub bound: f64,
}

impl std::fmt::Display for Outside {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {}: {:.3e} from the replay (at most {:.3e})",
            self.what, self.tensor, self.distance, self.bound
        )
    }
}

fn unfit(what: &str, why: impl std::fmt::Display) -> Verdict {
    Verdict::Mismatch(Outside {
        what: what.into(),
        tensor: why.to_string(),
        distance: f64::INFINITY,
        bound: 0.0,
    })
}

/// Replays `segment` from `start` and compares the replay with `end`.
pub fn check(
    net: &Network,
    train: &Dataset,
    segment: &Segment,
    start: &State,
    end: &State,
) -> Result<Verdict, ModelError> {
    let len = net.param_count();
    if !net.frozen().is_empty() {
        return Ok(unfit(
            "weights",
            "a model with frozen layers (not checked by segments)",
        ));
    }
    if start.weights.len() != len || end.weights.len() != len {
        return Ok(unfit("weights", "not the model's length"));
    }
    if end.optimizer.step != start.optimizer.step + u64::from(segment.steps) {
        return Ok(unfit("optimizer", "a step count other than the segment's"));
    }
    let kind = worker_core::inner(segment.optimizer);
    let mut optimizer = kind.build_masked(len, net.decayed_trained());
    if let Err(why) = optimizer.restore(start.optimizer.clone()) {
        return Ok(unfit("optimizer", why));
    }
    // The end state must be one this optimizer can hold, too.
    if let Err(why) = kind
        .build_masked(len, net.decayed_trained())
        .restore(end.optimizer.clone())
    {
        return Ok(unfit("optimizer", why));
    }
    let mut weights = start.weights.clone();
    let b = &segment.batches;
    for i in 0..u64::from(segment.steps) {
        let index = b.first + i;
        let positions = batch_positions(b.shard.len(), index, b.size);
        let (x, labels) = train.batch(positions.map(|p| b.shard.start + p));
        let seed = batch_seed(index, b.shard.start);
        let (_, grads) = with_order(Order::Library, || {
            net.loss_and_grad(&weights, x.view(), &labels, seed)
        })?;
        optimizer.step(&mut weights, &grads);
    }
    let replayed = optimizer.state();
    // Adam's ties, from the replay's second moment (none for SGD and momentum).
    let ties = match replayed.tensors.iter().find(|(name, _)| name == "v") {
        Some((_, v)) => ties(net, v),
        None => vec![false; len],
    };
    let reach = ADAM_STEP * kind.lr().abs() * segment.steps as f32;
    let delta =
        |w: &[f32]| -> Vec<f32> { start.weights.iter().zip(w).map(|(s, e)| s - e).collect() };
    let mut parts = vec![("weights".to_string(), delta(&end.weights), delta(&weights))];
    for (name, theirs) in &end.optimizer.tensors {
        let ours = replayed.tensors.iter().find(|(n, _)| n == name);
        let Some((_, ours)) = ours else {
            return Ok(unfit(
                "optimizer",
                format!("a tensor {name} it does not keep"),
            ));
        };
        parts.push((name.clone(), theirs.clone(), ours.clone()));
    }
    let mut worst: Option<Outside> = None;
    for (what, theirs, ours) in &parts {
        for (i, ((&t, &o), &tie)) in theirs.iter().zip(ours).zip(&ties).enumerate() {
            let off = f64::from((t - o).abs());
            // A tie's weight moves within Adam's reach; its moments are rounding's.
            let bound = if what == "weights" {
                f64::from(reach) + ABS
            } else {
                f64::from(o.abs()).max(ABS) * MARGINAL
            };
            // (NaN is never within.)
            if tie && (off > bound || off.is_nan()) {
                let far = Outside {
                    what: what.clone(),
                    tensor: format!("value {i}, an Adam tie"),
                    distance: off,
                    bound,
                };
                return Ok(Verdict::Mismatch(far));
            }
        }
        for t in net.layout().tensors() {
            let (mut off, mut norm, mut n) = (0f64, 0f64, 0usize);
            for i in t.range().filter(|&i| !ties[i]) {
                off += f64::from(theirs[i] - ours[i]).powi(2);
                norm += f64::from(ours[i]).powi(2);
                n += 1;
            }
            let bound = SEGMENT_TENSOR * (norm.sqrt() + ABS * (n as f64).sqrt());
            let distance = off.sqrt();
            let ratio = if distance == 0.0 {
                0.0
            } else {
                distance / bound
            };
            let worse = worst
                .as_ref()
                .is_none_or(|w| ratio > w.distance / w.bound || ratio.is_nan());
            if ratio > 1.0 && worse || ratio.is_nan() {
                worst = Some(Outside {
                    what: what.clone(),
                    tensor: t.name.clone(),
                    distance,
                    bound,
                });
            }
        }
    }
    Ok(match worst {
        None => Verdict::Matches,
        Some(w) if w.distance <= MARGINAL * w.bound => Verdict::Marginal(w),
        Some(w) => Verdict::Mismatch(w),
    })
}

/// Which values are Adam's ties: the root of their second moment below [`TIE`] of their
/// tensor's mean root.
fn ties(net: &Network, v: &[f32]) -> Vec<bool> {
    let mut out = vec![false; v.len()];
    for t in net.layout().tensors() {
        let roots: Vec<f32> = v[t.range()].iter().map(|v| v.max(0.0).sqrt()).collect();
        let mean = roots.iter().sum::<f32>() / roots.len().max(1) as f32;
        for (o, r) in out[t.range()].iter_mut().zip(&roots) {
            *o = *r < TIE * mean;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use model::OptimizerKind;

    use super::*;

    const ADAMW: protocol::InnerOptimizer = protocol::InnerOptimizer::AdamW {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        weight_decay: 0.1,
    };

    /// A worker's phase in another float order (each step's gradient in f64, rounded, as a
    /// GPU's is), its state every `k` steps.
    fn states(net: &Network, train: &Dataset, params: &[f32], steps: u64, k: u64) -> Vec<State> {
        let kind: OptimizerKind = worker_core::inner(ADAMW);
        let mut optimizer = kind.build_masked(params.len(), net.decayed_trained());
        let mut weights = params.to_vec();
        let mut out = vec![State {
            weights: weights.clone(),
            optimizer: optimizer.state(),
        }];
        for index in 0..steps {
            let (x, labels) = train.batch(batch_positions(64, index, 8));
            let wide: Vec<f64> = weights.iter().map(|&v| f64::from(v)).collect();
            let (_, g) = net
                .loss_and_grad(
                    &wide,
                    x.mapv(f64::from).view(),
                    &labels,
                    batch_seed(index, 0),
                )
                .expect("grad");
            let g: Vec<f32> = g.into_iter().map(|v| v as f32).collect();
            optimizer.step(&mut weights, &g);
            if (index + 1) % k == 0 {
                out.push(State {
                    weights: weights.clone(),
                    optimizer: optimizer.state(),
                });
            }
        }
        out
    }

    fn segment(first: u64, steps: u32) -> Segment {
        Segment {
            batches: Batches {
                shard: 0..64,
                first,
                size: 8,
                parts: 1,
            },
            steps,
            optimizer: ADAMW,
        }
    }

    /// Every segment of an honest phase in another order matches its replay from the
    /// worker's own start (the first, from a fresh optimizer, too); ×1.01 on the weights'
    /// delta, a step skipped, other batches, a doubled second moment and a tie pushed past
    /// Adam's reach do not, and none of them is merely marginal; ×1.002 is.
    #[test]
    fn an_honest_segment_matches_its_replay_and_cheats_do_not() {
        let (net, train, params) = super::super::verify::tests::gpt_setup();
        let states = states(&net, &train, &params, 16, 4);
        for (j, pair) in states.windows(2).enumerate() {
            let verdict = check(&net, &train, &segment(4 * j as u64, 4), &pair[0], &pair[1]);
            assert_eq!(verdict.expect("replays"), Verdict::Matches, "segment {j}");
        }
        let (start, end) = (&states[2], &states[3]);
        let here = segment(8, 4);
        let cheat = |end: &State| match check(&net, &train, &here, start, end).expect("replays") {
            Verdict::Mismatch(outside) => outside,
            other => panic!("{other:?}"),
        };
        let mut scaled = end.clone();
        for (w, s) in scaled.weights.iter_mut().zip(&start.weights) {
            *w = s - (s - *w) * 1.01;
        }
        assert_eq!(cheat(&scaled).what, "weights");
        // ×1.002: outside the tolerance, within four times it: marginal, not a strike.
        let mut nudged = end.clone();
        for (w, s) in nudged.weights.iter_mut().zip(&start.weights) {
            *w = s - (s - *w) * 1.002;
        }
        let verdict = check(&net, &train, &here, start, &nudged).expect("replays");
        assert!(matches!(verdict, Verdict::Marginal(_)), "{verdict:?}");
        // A step skipped: the end of three steps, said to be four.
        let three = states_after(&net, &train, start, 8, 3);
        let skipped = State {
            optimizer: OptimizerState {
                step: end.optimizer.step,
                ..three.optimizer
            },
            ..three
        };
        let outside = cheat(&skipped);
        assert!(outside.distance > MARGINAL * outside.bound, "{outside}");
        // Other batches (the next four: one of them the same).
        let other = states_after(&net, &train, start, 9, 4);
        cheat(&other);
        // The second moment doubled (the next segment would start from it).
        let mut moments = end.clone();
        for (name, v) in &mut moments.optimizer.tensors {
            if name == "v" {
                v.iter_mut().for_each(|v| *v *= 2.0);
            }
        }
        assert_eq!(cheat(&moments).what, "v");
        // The keys' bias is a tie: within Adam's reach it may be anywhere, beyond it not.
        let c = net.as_gpt().expect("a GPT").spec().width;
        let key = net
            .layout()
            .tensors()
            .iter()
            .find(|t| t.name == "h.0.attn.c_attn.bias")
            .expect("a tensor")
            .offset
            + c
            + 3;
        let mut within = end.clone();
        within.weights[key] += 3.0 * 1e-3;
        assert_eq!(
            check(&net, &train, &here, start, &within).expect("replays"),
            Verdict::Matches
        );
        let mut beyond = end.clone();
        beyond.weights[key] += 20.0 * 1e-3;
        assert!(cheat(&beyond).tensor.contains("tie"));
        // A state its optimizer cannot hold.
        let mut broken = end.clone();
        broken.optimizer.tensors.truncate(1);
        assert_eq!(cheat(&broken).what, "optimizer");
    }

    /// The worker's state after `steps` more steps from `start` on batches from `first`.
    fn states_after(
        net: &Network,
        train: &Dataset,
        start: &State,
        first: u64,
        steps: u64,
    ) -> State {
        let kind: OptimizerKind = worker_core::inner(ADAMW);
        let mut optimizer = kind.build_masked(start.weights.len(), net.decayed_trained());
        optimizer
            .restore(start.optimizer.clone())
            .expect("restores");
        let mut weights = start.weights.clone();
        for index in first..first + steps {
            let (x, labels) = train.batch(batch_positions(64, index, 8));
            let (_, g) = net
                .loss_and_grad(&weights, x.view(), &labels, batch_seed(index, 0))
                .expect("grad");
            optimizer.step(&mut weights, &g);
        }
        State {
            weights,
            optimizer: optimizer.state(),
        }
    }
}
