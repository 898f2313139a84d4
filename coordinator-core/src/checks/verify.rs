//! Verification by recomputation: the coordinator computes a sampled gradient itself, on
//! the very weights the worker was sent (after their wire compression) and the batch the
//! deterministic batch rule gives it, and compares.
//!
//! The comparison allows for what may honestly differ, value by value:
//! - the worker's own wire compression of its gradient: int8 rounds to half a step of its
//!   256-value chunk (step = chunk max / 127), int4 to half a step of its 64-value chunk
//!   (step = chunk max / 7); f16 to 2⁻¹¹ relative (and 3e-8 absolute below f16's normal
//!   range); f32 not at all. But int4's half step, 7 % of the chunk's largest value (int2's,
//!   half of it), would hide a gradient scaled by 1.01, so the largest value of an int4 or
//!   int2 chunk, which travels exactly (int4's: the chunk's scale times 7) or within 2⁻⁸
//!   (int2's: its scale, a bfloat16 since protocol 15), is held to float order and that
//!   rounding alone ([`largest_off`]);
//! - floating-point order: native workers with FMA differ from one without, and wasm from
//!   native, by up to 3e-8 on this model; 1e-6 absolute plus 1e-4 relative covers it with
//!   room.
//!
//! - flipped decisions: where a ReLU input or two max-pool candidates are within that
//!   rounding of each other, the worker and the coordinator may take different branches,
//!   and the gradient of the values behind it differs by far more than rounding (after some
//!   training, about one verification in six of the `cnn` preset between wasm and native).
//!   Values outside the tolerance are allowed only where such a near-tie explains them: the
//!   coordinator then finds the near-ties of its own forward pass, takes the other branch
//!   at each, and allows each value to lie between what every subset of those flips could
//!   make of it (`model::Network::loss_grad_envelope`), give or take the tolerance;
//! - and, in that case, cancellation: where a value is the sum of many products that
//!   cancel, two float orders differ by more than 1e-4 of the sum. The tolerance then grows
//!   by [`ROUNDING`] times the value's magnitude (the same sums over magnitudes).
//!
//! Any other value outside the tolerance is a mismatch, however small.
//!
//! A GPT has no near-ties (no ReLU, no max-pool) and no magnitude pass: its unordered
//! answers (a GPU's) are compared tensor by tensor instead, each within [`GPT_TENSOR`] of
//! its norm beyond the wire's rounding ([`compare_tensors`]).
//!
//! A gradient scaled by 1.01 or computed on another batch is outside that on most values;
//! one value changed anywhere no near-tie reaches is refused too.
//!
//! Two float orders are honest: the coordinator's own (matrixmultiply's kernel, fused
//! multiply-adds on a CPU with FMA) and wasm's (a multiply, then an add: every browser tab,
//! and native workers on CPUs without FMA). The answer is recomputed in the order the
//! worker's kind makes likelier first ([`Claim::order`]), and in the other if that does not
//! match: in its own order an honest answer is the coordinator's bit for bit
//! (`model::Order`). The near-tie envelope is the last resort, for any other order.
//!
//! A local phase's answer (`--local-steps`) is replayed step by step ([`replay`], the
//! worker's own code, `model::LocalPhase`): replaying H steps costs H gradients. Replayed in
//! another float order, a flip in one step moves every later step, which an envelope per
//! step does not bound: an honest tab's 45-step `cnn` phase ended 2.2 % of the norm away
//! from the FMA replay. In the tab's own order it is exact. A phase keeps the older
//! allowance for orders other than these two: up to 0.5 % of the values (none below 200
//! values) outside the tolerance, together at most 5 % of the pseudo-gradient's L2 norm.

use std::ops::Range;

use model::{
    batch_positions, batch_seed, with_order, Dataset, LocalPhase, ModelError, Network, Order,
    PhaseResult,
};
use protocol::Compression;

/// Floating-point order: FMA against none, wasm against native.
const ABS: f32 = 1e-6;
const REL: f32 = 1e-4;
/// Values that may lie outside the tolerance (flipped ReLUs and max-pools): one in
/// `FLIPS_SHARE`, together at most `FLIP_NORM` of the expected L2 norm.
const FLIPS_SHARE: usize = 200;
const FLIP_NORM: f64 = 0.05;
/// Half a quantization step, with 2 % room for the worker's chunk maximum differing from
/// ours in the last bits.
const HALF_STEP: f32 = 0.51;

/// What the coordinator needs to recompute a worker's gradient.
#[derive(Debug, Clone)]
pub struct Claim<'a> {
    /// The weights exactly as the worker decoded them.
    pub weights: &'a [f32],
    /// The worker's shard of the train split.
    pub shard: Range<usize>,
    /// The batch index (the round, in sync mode).
    pub batch_index: u64,
    pub batch_size: usize,
    pub compression: Compression,
    /// What the worker sent (decoded).
    pub grads: &'a [f32],
    /// The local phase its `Task` asked for, if any.
    pub local: Option<protocol::LocalPhase>,
    /// The float order to recompute in first: [`Order::Unfused`] for a browser tab. The
    /// other is tried too when this one does not match, so a worker that lies about its
    /// kind only costs the coordinator a second recomputation.
    pub order: Order,
    /// How many parts the worker computed each batch in (`Gradient::parts`, checked on
    /// arrival): recomputed in as many, an honest answer from several cores is exact. 0:
    /// unordered (a GPU), checked within rounding.
    pub parts: usize,
}

/// The float order a worker of this kind most likely computes in: a tab's unfused, or fused
/// where it said its products fuse (`Hello::fused`), a native worker's its library's.
pub fn likely_order(kind: protocol::WorkerKind, fused: bool) -> Order {
    match (kind, fused) {
        (protocol::WorkerKind::Browser, false) => Order::Unfused,
        (protocol::WorkerKind::Browser, true) => Order::Fused,
        (protocol::WorkerKind::Native, _) => Order::Library,
    }
}

/// The order tried second where the first did not match: a tab that said it fuses may have
/// computed unfused (and one that did not say may fuse: an older page), and a native worker
/// may be a tab that said otherwise.
fn other(order: Order) -> Order {
    match order {
        Order::Library => Order::Unfused,
        Order::Unfused => Order::Library,
        Order::Fused => Order::Unfused,
    }
}

/// Where a worker's batches come from: its shard of the train split, the batch index of the
/// first, and the batch size.
#[derive(Debug, Clone)]
pub struct Batches {
    pub shard: Range<usize>,
    pub first: u64,
    pub size: usize,
    /// The parts each batch is computed in (`model::Part`).
    pub parts: usize,
}

/// A local phase from `weights` (full layout) on `batches`, as the worker takes it.
pub fn replay(
    net: &Network,
    train: &Dataset,
    batches: &Batches,
    local: protocol::LocalPhase,
    weights: &[f32],
) -> Result<PhaseResult, ModelError> {
    let optimizer = local.optimizer;
    let mut phase = LocalPhase::new(net, weights, optimizer, local.steps);
    while !phase.is_done() {
        let index = batches.first + u64::from(phase.taken());
        let positions = batch_positions(batches.shard.len(), index, batches.size);
        let (x, labels) = train.batch(positions.map(|p| batches.shard.start + p));
        let seed = batch_seed(index, batches.shard.start);
        phase.step_parts(net, x.view(), &labels, seed, batches.parts)?;
    }
    Ok(phase.finish())
}

/// The first value outside the tolerance, and how many and how much lie outside.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mismatch {
    pub index: usize,
    pub got: f32,
    pub expected: f32,
    pub tolerance: f32,
    /// Values outside the tolerance (and, when near-ties were followed, outside what they
    /// explain).
    pub outside: usize,
    /// Their excess over the tolerance, as a share of the expected gradient's L2 norm.
    pub excess: f64,
    /// Near-ties of the coordinator's forward pass followed to explain them, if any were.
    pub ties: Option<usize>,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "value {} is {}, the coordinator computed {} (tolerance {:e}); {} values outside, \
             {:.2} % of the gradient's norm",
            self.index,
            self.got,
            self.expected,
            self.tolerance,
            self.outside,
            self.excess * 100.0
        )?;
        match self.ties {
            Some(0) => write!(f, ", and no ReLU or max-pool near-tie to explain them"),
            Some(n) => write!(f, ", not explained by its {n} ReLU and max-pool near-ties"),
            None => Ok(()),
        }
    }
}

/// What the tolerance may be widened by, per value: the envelope of the near-ties' flips
/// (`below` ≤ 0 ≤ `above`, in the gradient's layout), and the rounding of its sums
/// (`slack`: [`ROUNDING`] times their magnitude).
#[derive(Debug, Clone, Copy)]
struct Widened<'a> {
    below: &'a [f32],
    above: &'a [f32],
    slack: &'a [f32],
}

/// Rounding allowed per unit of a value's magnitude (the sums behind it taken over
/// magnitudes): two float orders of the same sums differ by about `√n` unit roundoffs of
/// it; this is measured with room (docs/BENCHMARKS.md#verification).
pub const ROUNDING: f32 = 1e-5;

/// Recomputes the claimed gradient and compares. `Ok(Err(_))`: it does not match.
pub fn verify(
    net: &Network,
    train: &Dataset,
    claim: &Claim<'_>,
) -> Result<Result<(), Mismatch>, ModelError> {
    if let Some(local) = claim.local {
        let batches = Batches {
            shard: claim.shard.clone(),
            first: claim.batch_index,
            size: claim.batch_size,
            // An unordered phase (none of ours: a tab's phases stay on its CPU) is replayed
            // in one part, within the allowance for other orders.
            parts: claim.parts.max(1),
        };
        let phase = |order| {
            with_order(order, || replay(net, train, &batches, local, claim.weights))
                .map(|r| compare_phase(claim.grads, &r.delta, claim.compression))
        };
        let first = phase(claim.order)?;
        if first.is_ok() {
            return Ok(first);
        }
        return Ok(match phase(other(claim.order))? {
            Ok(()) => Ok(()),
            // The mismatch with fewer values outside: the order the worker more likely used.
            Err(second) => Err(fewer_outside(first.unwrap_err(), second)),
        });
    }
    let positions = batch_positions(claim.shard.len(), claim.batch_index, claim.batch_size);
    let (x, labels) = train.batch(positions.map(|p| claim.shard.start + p));
    let seed = batch_seed(claim.batch_index, claim.shard.start);
    let parts = claim.parts.max(1);
    let gradient = |order| {
        with_order(order, || {
            net.loss_and_grad_parts(claim.weights, x.view(), &labels, seed, parts)
        })
        .map(|(_, g)| net.compact(g))
    };
    // An unordered answer (a GPU's, `protocol::UNORDERED`) matches no order bit for bit:
    // it is checked within rounding and the near-ties' envelope at once; a GPT's (which
    // has no near-ties) tensor by tensor. Any other claim of a GPT is replayed in both
    // orders.
    let orders: &[Order] = match (claim.parts, net.has_envelope()) {
        (0, true) => &[],
        (0, false) => {
            let expected = gradient(Order::Library)?;
            return Ok(compare_tensors(
                net.layout(),
                claim.grads,
                &expected,
                claim.compression,
            ));
        }
        _ => &[claim.order, other(claim.order)],
    };
    let mut expected = Vec::new();
    let mut last = None;
    for &order in orders {
        let computed = gradient(order)?;
        match compare(claim.grads, &computed, claim.compression) {
            Ok(()) => return Ok(Ok(())),
            Err(mismatch) => last = Some(mismatch),
        }
        if order == Order::Library {
            expected = computed;
        }
    }
    // A GPT's ordered answers (a CPU's): outside rounding in both orders is a mismatch,
    // whatever order it claims.
    if let (Some(mismatch), false) = (last, net.has_envelope()) {
        return Ok(Err(mismatch));
    }
    // Outside rounding in both orders (or unordered): only a near-tie may explain it (of
    // the library's order, in which the envelope is computed, with the gradient an
    // unordered answer is compared with).
    let (whole, envelope) = net.loss_grad_envelope(claim.weights, x.view(), &labels, seed)?;
    if orders.is_empty() {
        expected = net.compact(whole);
    }
    let (below, above) = (net.compact(envelope.below), net.compact(envelope.above));
    let slack: Vec<f32> = net
        .compact(envelope.magnitude)
        .into_iter()
        .map(|m| m * ROUNDING)
        .collect();
    let widened = Widened {
        below: &below,
        above: &above,
        slack: &slack,
    };
    Ok(
        match measure(
            claim.grads,
            &expected,
            claim.compression,
            1.0,
            Some(widened),
        ) {
            None => Ok(()),
            Some(m) => Err(Mismatch {
                ties: Some(envelope.ties),
                ..m
            }),
        },
    )
}

/// An unordered GPT answer (a GPU's): each parameter tensor's distance from the
/// coordinator's gradient, beyond what the wire's compression moved each value, within
/// this share of the tensor's norm (plus [`ABS`] a value, for a tensor whose gradient is
/// zero or nearly). A GPT has no ReLU and no max-pool, so no near-tie moves a value
/// beyond rounding; its sums' rounding in another order (measured: a GPU on SwiftShader,
/// 3.9e-7 of a tensor's norm; the coordinator's two CPU orders and f64, in the tests)
/// lies far inside it. A gradient scaled by 1.01 is 1e-2 away in every tensor.
pub const GPT_TENSOR: f64 = 1e-4;

/// [`GPT_TENSOR`]'s check, tensor by tensor over the layout: the first tensor outside it.
pub fn compare_tensors(
    layout: &model::ParamLayout,
    got: &[f32],
    expected: &[f32],
    compression: Compression,
) -> Result<(), Mismatch> {
    if got.len() != expected.len() || expected.len() != layout.total() {
        return measure(got, expected, compression, 1.0, None).map_or(Ok(()), Err);
    }
    if compression.coarse() {
        // The chunks' largest values, held to the same share of the whole answer's norm.
        let chunk = compression.chunk_len();
        let (mut off_sq, mut norm_sq) = (0f64, 0f64);
        let (mut worst, mut outside) = ((0f32, 0), 0);
        for (at, (g, e)) in got.chunks(chunk).zip(expected.chunks(chunk)).enumerate() {
            let (off, _, largest) = largest_off(g, e.iter().map(|&v| (v, v)), compression);
            off_sq += f64::from(off).powi(2);
            outside += usize::from(off > 0.0);
            norm_sq += e.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>();
            if off > worst.0 {
                worst = (off, at * chunk + largest);
            }
        }
        within_share(off_sq, norm_sq, got.len(), (got, expected, worst.1), || {
            outside
        })?;
    }
    let wire = wire_rounding(expected, compression);
    for t in layout.tensors() {
        let range = t.range();
        let (mut off_sq, mut norm_sq, mut worst) = (0f64, 0f64, (0f32, range.start));
        for i in range.clone() {
            let off = if got[i].is_nan() {
                f32::INFINITY
            } else {
                ((got[i] - expected[i]).abs() - wire[i]).max(0.0)
            };
            off_sq += f64::from(off).powi(2);
            norm_sq += f64::from(expected[i]).powi(2);
            if off > worst.0 {
                worst = (off, i);
            }
        }
        let outside = || {
            range
                .clone()
                .filter(|&j| (got[j] - expected[j]).abs() > ABS + REL * expected[j].abs())
                .count()
        };
        within_share(
            off_sq,
            norm_sq,
            range.len(),
            (got, expected, worst.1),
            outside,
        )?;
    }
    Ok(())
}

/// A distance (`off_sq`, squared) over `len` values whose norm is `norm_sq` (squared): within
/// [`GPT_TENSOR`] of the norm, or the mismatch, named at `got[at]` with `outside` values.
fn within_share(
    off_sq: f64,
    norm_sq: f64,
    len: usize,
    (got, expected, at): (&[f32], &[f32], usize),
    outside: impl FnOnce() -> usize,
) -> Result<(), Mismatch> {
    let bound = GPT_TENSOR * (norm_sq.sqrt() + f64::from(ABS) * (len as f64).sqrt());
    let off = off_sq.sqrt();
    if off <= bound {
        return Ok(());
    }
    Err(Mismatch {
        index: at,
        got: got[at],
        expected: expected[at],
        tolerance: bound as f32,
        outside: outside(),
        excess: off / norm_sq.sqrt().max(f64::MIN_POSITIVE),
        ties: None,
    })
}

/// How far the wire's compression may have moved a value within one chunk of its values
/// ([`Compression::chunk_len`]): nothing for f32, f16's rounding of the value, or half of
/// int8's or int4's step, which the chunk's largest value sets.
#[derive(Debug, Clone, Copy)]
struct Wire {
    compression: Compression,
    /// int8's or int4's step in this chunk.
    step: f32,
}

impl Wire {
    /// For a chunk whose values are as large as `sizes`.
    fn for_chunk(compression: Compression, sizes: impl Iterator<Item = f32>) -> Self {
        let step = match compression.levels() {
            0 => 0.0,
            levels => sizes.fold(0.0f32, f32::max) / f32::from(levels),
        };
        Self { compression, step }
    }

    /// For a value as large as `size`.
    fn at(self, size: f32) -> f32 {
        match self.compression {
            Compression::None => 0.0,
            Compression::F16 => size / 2048.0 + 3e-8,
            Compression::Int8 | Compression::Int4 | Compression::Int2 => HALF_STEP * self.step,
        }
    }
}

/// How far the largest `|value|` of an int4 or int2 chunk `got` lies outside what the
/// expected chunk's largest may be (each expected value anywhere in its `(lo, hi)` range),
/// that largest's upper end, and where in `got` its largest is. The largest value travels
/// nearly exactly: it is the chunk's scale times 7 (int4's, exact) or its scale (int2's,
/// rounded to a bfloat16 since protocol 15: [`Compression::scale_rounding`], at most 2⁻⁸ of
/// it), so only float order and that rounding may move it, not the step. A NaN is not
/// counted here (the values' own check finds it).
fn largest_off(
    got: &[f32],
    ranges: impl Iterator<Item = (f32, f32)>,
    compression: Compression,
) -> (f32, f32, usize) {
    let (mut low, mut high) = (0.0f32, 0.0f32);
    for (lo, hi) in ranges {
        high = high.max(lo.abs().max(hi.abs()));
        // The least `|x|` for `x` in `lo..=hi`.
        let least = if lo <= 0.0 && hi >= 0.0 {
            0.0
        } else {
            lo.abs().min(hi.abs())
        };
        low = low.max(least);
    }
    let rounding = compression.scale_rounding();
    let (low, high) = (low * (1.0 - rounding), high * (1.0 + rounding));
    let (at, largest) =
        got.iter().enumerate().fold(
            (0, 0.0f32),
            |(i, m), (j, x)| if x.abs() > m { (j, x.abs()) } else { (i, m) },
        );
    ((low - largest).max(largest - high).max(0.0), high, at)
}

/// How far the wire's compression may have moved each value of `expected` (with 1 % room).
fn wire_rounding(expected: &[f32], compression: Compression) -> Vec<f32> {
    expected
        .chunks(compression.chunk_len())
        .flat_map(|chunk| {
            let wire = Wire::for_chunk(compression, chunk.iter().map(|v| v.abs()));
            chunk.iter().map(move |v| wire.at(v.abs()) * 1.01)
        })
        .collect()
}

fn fewer_outside(a: Mismatch, b: Mismatch) -> Mismatch {
    if b.outside < a.outside {
        b
    } else {
        a
    }
}

/// Compares `got` with `expected` value by value within the tolerance of `compression`:
/// no value may lie outside.
pub fn compare(got: &[f32], expected: &[f32], compression: Compression) -> Result<(), Mismatch> {
    measure(got, expected, compression, 1.0, None).map_or(Ok(()), Err)
}

/// A local phase's pseudo-gradient against its replay: a few values may lie outside (see
/// the module's notes).
pub fn compare_phase(
    got: &[f32],
    expected: &[f32],
    compression: Compression,
) -> Result<(), Mismatch> {
    match measure(got, expected, compression, 1.0, None) {
        None => Ok(()),
        Some(m) if m.outside <= got.len() / FLIPS_SHARE && m.excess <= FLIP_NORM => Ok(()),
        Some(m) => Err(m),
    }
}

/// Whether two workers' answers for the same weights and batch agree (`--replicate`): both
/// went through the wire compression, so the wire term counts twice. No value may lie
/// outside: two honest answers across a near-tie disagree, and the coordinator's
/// recomputation (which follows near-ties) settles it.
pub fn agree(a: &[f32], b: &[f32], compression: Compression) -> Result<(), Mismatch> {
    measure(a, b, compression, 2.0, None).map_or(Ok(()), Err)
}

/// The values outside the per-value tolerance (widened by near-ties' envelope, if given),
/// if any: the first, their count and excess.
fn measure(
    got: &[f32],
    expected: &[f32],
    compression: Compression,
    claims: f32,
    widened: Option<Widened<'_>>,
) -> Option<Mismatch> {
    let envelope_fits = widened.is_none_or(|w| {
        [w.below.len(), w.above.len(), w.slack.len()]
            .iter()
            .all(|&n| n == expected.len())
    });
    if got.len() != expected.len() || !envelope_fits {
        return Some(Mismatch {
            index: got.len().min(expected.len()),
            got: f32::NAN,
            expected: f32::NAN,
            tolerance: 0.0,
            outside: got.len().max(expected.len()),
            excess: f64::INFINITY,
            ties: None,
        });
    }
    // Where near-ties widen a value's range, its chunk's step may be the larger maximum's
    // too (the worker quantized its own answer).
    let reach = |i: usize, e: f32| match widened {
        Some(w) => (e + w.below[i], e + w.above[i]),
        None => (e, e),
    };
    let mut first: Option<Mismatch> = None;
    let (mut outside, mut excess_sq, mut norm_sq) = (0usize, 0.0f64, 0.0f64);
    let chunk = compression.chunk_len();
    for (chunk_at, (g, e)) in got.chunks(chunk).zip(expected.chunks(chunk)).enumerate() {
        let base = chunk_at * chunk;
        let size = |i: usize, v: f32| {
            let (lo, hi) = reach(base + i, v);
            lo.abs().max(hi.abs())
        };
        let wire = Wire::for_chunk(compression, e.iter().enumerate().map(|(i, &v)| size(i, v)));
        if compression.coarse() {
            let ranges = e.iter().enumerate().map(|(i, &v)| reach(base + i, v));
            let (off, high, largest) = largest_off(g, ranges, compression);
            let slack = widened.map_or(0.0, |w| {
                w.slack[base..base + e.len()]
                    .iter()
                    .fold(0.0, |m: f32, s| m.max(*s))
            });
            let tolerance = ABS + REL * high + slack;
            if off > tolerance {
                outside += 1;
                excess_sq += f64::from(off - tolerance).powi(2);
                first.get_or_insert(Mismatch {
                    index: base + largest,
                    got: g[largest],
                    expected: e[largest],
                    tolerance,
                    outside: 0,
                    excess: 0.0,
                    ties: None,
                });
            }
        }
        for (i, (&got, &expected)) in g.iter().zip(e).enumerate() {
            let (lo, hi) = reach(base + i, expected);
            let wire = wire.at(size(i, expected));
            let slack = widened.map_or(0.0, |w| w.slack[base + i]);
            let tolerance = claims * wire * 1.01 + ABS + REL * lo.abs().max(hi.abs()) + slack;
            norm_sq += f64::from(expected) * f64::from(expected);
            let off = if got.is_nan() {
                f32::INFINITY
            } else if got < lo {
                lo - got
            } else if got > hi {
                got - hi
            } else {
                0.0
            };
            if off.is_nan() || off > tolerance {
                outside += 1;
                excess_sq += f64::from(off - tolerance).powi(2);
                first.get_or_insert(Mismatch {
                    index: base + i,
                    got,
                    expected,
                    tolerance,
                    outside: 0,
                    excess: 0.0,
                    ties: None,
                });
            }
        }
    }
    let excess = (excess_sq / norm_sq).sqrt();
    first.map(|first| Mismatch {
        outside,
        excess: if excess.is_nan() {
            f64::INFINITY
        } else {
            excess
        },
        ..first
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use protocol::tensor::{decode_payload, encode_payload};

    use super::*;

    fn wire(values: &[f32], c: Compression) -> Vec<f32> {
        let mut raw = Vec::new();
        encode_payload(&mut raw, values, c);
        decode_payload(&raw, values.len(), c)
    }

    fn setup() -> (Network, Dataset, Vec<f32>) {
        let split = crate::data::digits(5);
        let mlp =
            Network::new(model::NetSpec::mlp(split.train.shape(), &[16], 10), 10).expect("model");
        let params: Vec<f32> = mlp.init(9);
        (mlp, split.train, params)
    }

    /// What an honest worker sends: its gradient on the decoded weights, through the wire.
    fn honest(
        mlp: &Network,
        train: &Dataset,
        weights: &[f32],
        batch: u64,
        c: Compression,
    ) -> Vec<f32> {
        let shard = train.slice(100..400);
        let (x, labels) = shard.batch(batch_positions(shard.len(), batch, 32));
        let seed = batch_seed(batch, 100);
        let (_, g) = mlp
            .loss_and_grad(weights, x.view(), &labels, seed)
            .expect("grad");
        wire(&g, c)
    }

    #[test]
    fn an_honest_gradient_passes_in_every_compression_and_a_cheat_does_not() {
        let (mlp, train, params) = setup();
        for c in Compression::ALL {
            let weights = wire(&params, c.for_weights());
            let claim = |grads: &[f32], batch_index| {
                let claim = Claim {
                    local: None,
                    order: model::Order::Library,
                    parts: 1,
                    weights: &weights,
                    shard: 100..400,
                    batch_index,
                    batch_size: 32,
                    compression: c,
                    grads,
                };
                verify(&mlp, &train, &claim).expect("computes")
            };
            let good = honest(&mlp, &train, &weights, 7, c);
            assert_eq!(claim(&good, 7), Ok(()), "{c:?}");
            // Scaled by 1.01 before the wire, as a cheating worker would.
            let raw = honest(&mlp, &train, &weights, 7, Compression::None);
            let scaled: Vec<f32> = raw.iter().map(|v| v * 1.01).collect();
            assert!(claim(&wire(&scaled, c), 7).is_err(), "{c:?}: ×1.01 caught");
            // Another batch.
            let other = honest(&mlp, &train, &weights, 8, c);
            let err = claim(&other, 7).expect_err("wrong batch");
            assert!(
                err.to_string().contains("the coordinator computed"),
                "{err}"
            );
        }
    }

    #[test]
    fn the_tolerance_is_the_wire_rounding_plus_float_order() {
        let expected = [1.0f32, -0.5, 0.0, 1e-9];
        let compare = |got: &[f32], expected: &[f32], c| match measure(got, expected, c, 1.0, None)
        {
            None => Ok(()),
            Some(m) => Err(m),
        };
        let agree = |a: &[f32], b: &[f32], c| match measure(a, b, c, 2.0, None) {
            None => Ok(()),
            Some(m) => Err(m),
        };
        // f32: only float order.
        assert!(compare(&[1.0 + 5e-5, -0.5, 0.0, 0.0], &expected, Compression::None).is_ok());
        assert!(compare(&[1.001, -0.5, 0.0, 0.0], &expected, Compression::None).is_err());
        // int8: half a step of the chunk (max 1.0 → step 1/127).
        assert!(compare(
            &[1.0, -0.5 + 0.5 / 127.0, 0.0, 0.0],
            &expected,
            Compression::Int8
        )
        .is_ok());
        assert!(compare(
            &[1.0, -0.5 + 1.0 / 127.0, 0.0, 0.0],
            &expected,
            Compression::Int8
        )
        .is_err());
        assert!(
            compare(&[1.0], &expected, Compression::Int8).is_err(),
            "length"
        );
        // Two answers each half a step off, in opposite directions, agree; a step and a
        // half apart do not.
        let (up, down) = (-0.5 + 0.5 / 127.0, -0.5 - 0.5 / 127.0);
        let a = [1.0, up, 0.0, 0.0];
        assert!(agree(&a, &[1.0, down, 0.0, 0.0], Compression::Int8).is_ok());
        assert!(agree(&a, &[1.0, down - 1.0 / 127.0, 0.0, 0.0], Compression::Int8).is_err());
        assert!(agree(&a, &[1.0, up * 1.01, 0.0, 0.0], Compression::None).is_err());
    }

    /// A local phase's allowance (see the module's notes).
    #[test]
    fn in_a_phase_a_few_flipped_values_pass_and_more_or_larger_ones_do_not() {
        let expected: Vec<f32> = (0..4000).map(|i| ((i % 17) as f32 - 8.0) * 1e-3).collect();
        let norm = expected.iter().map(|v| v * v).sum::<f32>().sqrt();
        // 20 values (of the 20 allowed) off by 0.2 % of the norm each: about 1 % in all.
        let mut flipped = expected.clone();
        for i in (0..4000).step_by(200) {
            flipped[i] += norm * 0.002;
        }
        assert_eq!(
            compare_phase(&flipped, &expected, Compression::None),
            Ok(())
        );
        // One more value outside: too many.
        flipped[4] += norm * 0.002;
        let err = compare_phase(&flipped, &expected, Compression::None).expect_err("21 values");
        assert_eq!(err.outside, 21);
        assert!(err.to_string().contains("21 values outside"), "{err}");
        // A single value off by 6 % of the norm: too much.
        let mut one = expected.clone();
        one[7] += norm * 0.06;
        let err = compare_phase(&one, &expected, Compression::None).expect_err("6 %");
        assert!((err.excess - 0.06).abs() < 1e-3, "{err}");
        // NaN is never within anything.
        let mut nan = expected.clone();
        nan[0] = f32::NAN;
        assert!(compare_phase(&nan, &expected, Compression::None).is_err());
    }

    fn claim<'a>(weights: &'a [f32], grads: &'a [f32], batch_index: u64) -> Claim<'a> {
        Claim {
            local: None,
            order: model::Order::Library,
            parts: 1,
            weights,
            shard: 100..400,
            batch_index,
            batch_size: 32,
            compression: Compression::None,
            grads,
        }
    }

    /// The hole the older allowance left: 20 values (of 12,730) each moved by 0.2 % of the
    /// norm passed it. No near-tie explains them, so they are refused now.
    #[test]
    fn a_few_small_lies_where_no_tie_reaches_are_refused() {
        let (mlp, train, params) = setup();
        let good = honest(&mlp, &train, &params, 7, Compression::None);
        let norm = good.iter().map(|v| v * v).sum::<f32>().sqrt();
        let mut lies = good.clone();
        for i in (0..lies.len()).step_by(600).take(20) {
            lies[i] += norm * 0.002;
        }
        assert_eq!(
            compare_phase(&lies, &good, Compression::None),
            Ok(()),
            "the older allowance let them in"
        );
        let err = verify(&mlp, &train, &claim(&params, &lies, 7))
            .expect("computes")
            .expect_err("refused");
        assert_eq!(err.outside, 20, "{err}");
        assert!(err.to_string().contains("near-tie"), "{err}");
        assert_eq!(
            verify(&mlp, &train, &claim(&params, &good, 7)).expect("computes"),
            Ok(())
        );
    }

    /// A hidden unit whose input is 3e-6 above zero for the batch's first sample: a worker
    /// whose float order puts it below zero (emulated: that unit's bias 6e-6 lower) sends a
    /// gradient far outside rounding, which the near-tie explains.
    /// A tab computes unfused (wasm has no FMA): its phase replayed in that order is the
    /// coordinator's bit for bit, whichever order its kind made the verifier try first; the
    /// same phase scaled by 1.01 is refused in both.
    #[test]
    fn a_phase_in_wasm_order_is_replayed_exactly_and_a_scaled_one_is_refused() {
        let (mlp, train, params) = setup();
        let local = protocol::LocalPhase {
            steps: 40,
            optimizer: model::OptimizerKind::Sgd { lr: 0.1 },
            segment: 0,
        };
        // A tab on one core, and a tab whose batches are split over three Web Workers.
        for parts in [1, 3] {
            let batches = Batches {
                shard: 100..400,
                first: 7,
                size: 32,
                parts,
            };
            let tab = with_order(Order::Unfused, || {
                replay(&mlp, &train, &batches, local, &params)
            })
            .expect("replays")
            .delta;
            let again = with_order(Order::Unfused, || {
                replay(&mlp, &train, &batches, local, &params)
            })
            .expect("replays")
            .delta;
            assert!(tab
                .iter()
                .zip(&again)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
            let scaled: Vec<f32> = tab.iter().map(|v| v * 1.01).collect();
            for order in [Order::Library, Order::Unfused] {
                let claim = |grads| Claim {
                    local: Some(local),
                    order,
                    parts,
                    ..claim(&params, grads, 7)
                };
                assert_eq!(
                    verify(&mlp, &train, &claim(&tab)).expect("computes"),
                    Ok(()),
                    "{parts} parts"
                );
                assert!(verify(&mlp, &train, &claim(&scaled))
                    .expect("computes")
                    .is_err());
            }
        }
    }

    /// A tab whose relaxed SIMD fuses computes its phase fused (`Order::Fused`), which is
    /// another phase than the unfused one: replayed in the order its `Hello` named it is the
    /// coordinator's bit for bit; a tab that said it fuses and computed unfused is matched by
    /// the order tried second; scaled by 1.01 either is refused.
    #[test]
    fn a_fused_tabs_phase_is_replayed_in_its_order() {
        let (mlp, train, params) = setup();
        let local = protocol::LocalPhase {
            steps: 40,
            optimizer: model::OptimizerKind::Sgd { lr: 0.1 },
            segment: 0,
        };
        let batches = Batches {
            shard: 100..400,
            first: 7,
            size: 32,
            parts: 1,
        };
        let phase = |order| {
            with_order(order, || replay(&mlp, &train, &batches, local, &params))
                .expect("replays")
                .delta
        };
        let (fused, unfused) = (phase(Order::Fused), phase(Order::Unfused));
        assert!(
            fused.iter().zip(&unfused).any(|(a, b)| a != b),
            "two orders, two phases"
        );
        assert_eq!(
            likely_order(protocol::WorkerKind::Browser, true),
            Order::Fused
        );
        for honest in [&fused, &unfused] {
            let scaled: Vec<f32> = honest.iter().map(|v| v * 1.01).collect();
            for (grads, matches) in [(honest, true), (&scaled, false)] {
                let says_fused = Claim {
                    local: Some(local),
                    order: likely_order(protocol::WorkerKind::Browser, true),
                    parts: 1,
                    ..claim(&params, grads, 7)
                };
                let verdict = verify(&mlp, &train, &says_fused).expect("computes");
                assert_eq!(verdict.is_ok(), matches, "{verdict:?}");
            }
        }
    }

    /// A GPU's answer (`parts` 0, unordered) is checked within rounding: one computed in
    /// another order (emulated here in f64, then rounded) passes; scaled by 1.01, or one
    /// value moved by 1 %, it is refused.
    #[test]
    fn an_unordered_answer_passes_within_rounding_and_a_scaled_one_does_not() {
        let (mlp, train, params) = setup();
        let shard = train.slice(100..400);
        let (x, labels) = shard.batch(batch_positions(shard.len(), 7, 32));
        let wide: Vec<f64> = params.iter().map(|&v| f64::from(v)).collect();
        let (_, g) = mlp
            .loss_and_grad(&wide, x.mapv(f64::from).view(), &labels, batch_seed(7, 100))
            .expect("computes");
        let gpu: Vec<f32> = mlp.compact(g).into_iter().map(|v| v as f32).collect();
        let library = honest(&mlp, &train, &params, 7, Compression::None);
        assert!(
            gpu.iter().zip(&library).any(|(a, b)| a != b),
            "another order than the coordinator's"
        );
        let unordered = |grads| Claim {
            parts: usize::from(protocol::UNORDERED),
            ..claim(&params, grads, 7)
        };
        assert_eq!(
            verify(&mlp, &train, &unordered(&gpu)).expect("computes"),
            Ok(())
        );
        let scaled: Vec<f32> = gpu.iter().map(|v| v * 1.01).collect();
        let err = verify(&mlp, &train, &unordered(&scaled))
            .expect("computes")
            .expect_err("refused");
        assert!(err.outside > gpu.len() / 10, "{err}");
        let big = (0..gpu.len())
            .max_by(|&a, &b| gpu[a].abs().total_cmp(&gpu[b].abs()))
            .expect("values");
        let mut one = gpu.clone();
        one[big] *= 1.01;
        assert!(verify(&mlp, &train, &unordered(&one))
            .expect("computes")
            .is_err());
    }

    /// A small GPT on 64 random windows of 40 tokens, its weights five SGD steps from
    /// their initialisation.
    pub(crate) fn gpt_setup() -> (Network, Dataset, Vec<f32>) {
        let spec = model::gpt::GptSpec {
            vocab: 40,
            context: 16,
            layers: 2,
            heads: 2,
            width: 32,
        };
        let net = Network::new(model::NetSpec::gpt(spec), 40).expect("a GPT");
        let mut rng = model::SplitMix64::new(5);
        let ids = (0..64 * 17).map(|_| rng.below(40) as u8).collect();
        let data = Dataset::from_parts(
            model::Shape::flat(17),
            model::Values::U8(ids),
            vec![0; 64],
            model::Normalization::new(vec![0.0], vec![1.0]),
        )
        .expect("windows");
        let mut params: Vec<f32> = net.init(9);
        for k in 0..5 {
            let (x, labels) = data.batch(batch_positions(64, k, 8));
            let (_, g) = net
                .loss_and_grad(&params, x.view(), &labels, 0)
                .expect("grad");
            for (p, g) in params.iter_mut().zip(&g) {
                *p -= 0.5 * g;
            }
        }
        (net, data, params)
    }

    /// The largest distance of any tensor of `got` from `expected`, over its norm.
    fn largest_distance(layout: &model::ParamLayout, got: &[f32], expected: &[f32]) -> f64 {
        let norm = |v: &[f32]| v.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
        layout
            .tensors()
            .iter()
            .map(|t| {
                let off: Vec<f32> = got[t.range()]
                    .iter()
                    .zip(&expected[t.range()])
                    .map(|(a, b)| a - b)
                    .collect();
                norm(&off) / norm(&expected[t.range()])
            })
            .fold(0.0, f64::max)
    }

    /// A GPU's GPT answer is checked tensor by tensor (`GPT_TENSOR`): answers in the
    /// coordinator's other order and in f64 (two other float orders) pass through every
    /// compression; ×1.01, another batch, and one tensor moved by 1e-3 of its norm are
    /// refused.
    #[test]
    fn an_unordered_gpt_answer_is_checked_tensor_by_tensor() {
        let (gpt, data, params) = gpt_setup();
        let layout = gpt.as_gpt().expect("a GPT").layout().clone();
        let batch = |k| {
            let (x, labels) = data.batch(batch_positions(64, k, 8));
            let seed = batch_seed(k, 0);
            let wide: Vec<f64> = params.iter().map(|&v| f64::from(v)).collect();
            let (_, g64) = gpt
                .loss_and_grad(&wide, x.mapv(f64::from).view(), &labels, seed)
                .expect("grad");
            let in_order = |order| {
                with_order(order, || {
                    gpt.loss_and_grad(&params, x.view(), &labels, seed)
                })
                .expect("grad")
                .1
            };
            let f64_order: Vec<f32> = g64.into_iter().map(|v| v as f32).collect();
            (
                in_order(Order::Library),
                in_order(Order::Unfused),
                f64_order,
            )
        };
        let (library, unfused, f64_order) = batch(3);
        let (_, _, other_batch) = batch(4);
        for (name, honest) in [("unfused", &unfused), ("f64", &f64_order)] {
            assert_ne!(honest, &library, "{name}: another order");
            println!(
                "{name}: largest distance {:.2e} of a tensor's norm",
                largest_distance(&layout, honest, &library)
            );
        }
        let scaled: Vec<f32> = f64_order.iter().map(|v| v * 1.01).collect();
        let mut one = f64_order.clone();
        let proj = layout
            .tensors()
            .iter()
            .find(|t| t.name == "h.1.attn.c_proj.weight")
            .expect("a tensor")
            .range();
        let norm = one[proj.clone()].iter().map(|v| v * v).sum::<f32>().sqrt();
        one[proj.start] += 1e-3 * norm;
        for c in Compression::ALL {
            let verdict = |grads: &[f32]| {
                let claim = Claim {
                    local: None,
                    order: Order::Library,
                    parts: usize::from(protocol::UNORDERED),
                    weights: &params,
                    shard: 0..64,
                    batch_index: 3,
                    batch_size: 8,
                    compression: c,
                    grads: &wire(grads, c),
                };
                verify(&gpt, &data, &claim).expect("computes")
            };
            assert_eq!(verdict(&unfused), Ok(()), "{c:?}");
            assert_eq!(verdict(&f64_order), Ok(()), "{c:?}");
            // (Beyond the wire's rounding: all of the 1 % but in int8, whose half step
            // takes much of it; in int4, whose half step takes all of it, the chunks'
            // largest values show it.)
            let err = verdict(&scaled).expect_err("×1.01");
            assert!(err.excess > 10.0 * GPT_TENSOR, "{c:?}: {err}");
            assert!(verdict(&other_batch).is_err(), "{c:?}: another batch");
            if c.levels() == 0 {
                // (int8's and int4's step in that chunk is larger than the lie.)
                let err = verdict(&one).expect_err("one tensor moved");
                assert_eq!(err.index, proj.start, "{c:?}: {err}");
            }
        }
    }

    /// int4's half step is 7 % of its chunk's largest value and int2's half of it, so ×1.01
    /// hides inside it value by value; each chunk's largest value, which travels exactly
    /// (int4's) or within 2⁻⁸ (int2's bfloat16 scale), shows it in every chunk.
    #[test]
    fn int4_and_int2_hold_each_chunks_largest_value_to_float_order() {
        for c in [Compression::Int4, Compression::Int2] {
            coarse_holds_the_largest(c);
        }
    }

    fn coarse_holds_the_largest(c: Compression) {
        let levels = f32::from(c.levels());
        // Heavy-tailed, as a phase's pseudo-gradient is: most values far below their
        // chunk's largest.
        let expected: Vec<f32> = (0..640)
            .map(|i| ((i * 37 % 101) as f32 / 50.0 - 1.0).powi(3) * 0.05)
            .collect();
        assert_eq!(compare(&wire(&expected, c), &expected, c), Ok(()));
        assert_eq!(compare_phase(&wire(&expected, c), &expected, c), Ok(()));
        let scaled: Vec<f32> = expected.iter().map(|v| v * 1.01).collect();
        let lie = wire(&scaled, c);
        // Value by value, the lie is within int4's rounding of the truth (but for a few that
        // sit near the edge of a high level: fewer than a phase may have outside)...
        let mut off = 0;
        for (l, e) in lie.chunks(64).zip(expected.chunks(64)) {
            let step = e.iter().fold(0.0f32, |m, v| m.max(v.abs())) / levels;
            let tolerance = |b: f32| HALF_STEP * step * 1.01 + ABS + REL * b.abs();
            off += l
                .iter()
                .zip(e)
                .filter(|(a, b)| (*a - *b).abs() > tolerance(**b))
                .count();
        }
        assert!(off <= expected.len() / FLIPS_SHARE, "{c:?}: {off}");
        // ...but not at any chunk's largest.
        let err = compare_phase(&lie, &expected, c).expect_err("×1.01");
        assert_eq!(err.outside, 10, "{c:?}: {err}");
        // Named at the first chunk's largest value.
        let top = lie[..64].iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert!(err.index < 64 && err.got.abs() == top, "{err}");
        // One value below its chunk's largest may move within half a step; the largest may
        // not move by a part in 1e3 (int4's, whose scale travels exact) or past its scale's
        // bfloat16 (int2's, 2⁻⁸ of it): by a part in 1e2.
        let largest = (0..64)
            .max_by(|&a, &b| expected[a].abs().total_cmp(&expected[b].abs()))
            .expect("a value");
        let below = (largest + 1) % 64;
        let mut moved = wire(&expected, c);
        moved[below] += 0.4 * expected[largest].abs() / levels - (moved[below] - expected[below]);
        assert_eq!(compare(&moved, &expected, c), Ok(()));
        let mut moved = wire(&expected, c);
        moved[largest] *= 1.0 + 2.0 * c.scale_rounding().max(5e-4);
        assert!(compare(&moved, &expected, c).is_err());
    }

    #[test]
    fn an_honest_answer_across_a_relu_tie_passes() {
        let (mlp, train, mut params) = setup();
        let shard = train.slice(100..400);
        let (x, _) = shard.batch(batch_positions(shard.len(), 7, 32));
        let (inputs, hidden) = (784, 16);
        let bias = inputs * hidden;
        let unit_input =
            |p: &[f32]| (0..inputs).map(|i| x[[0, i]] * p[i * hidden]).sum::<f32>() + p[bias];
        params[bias] += 3e-6 - unit_input(&params);
        let mut other = params.clone();
        other[bias] -= 6e-6;
        let across = honest(&mlp, &train, &other, 7, Compression::None);
        let plain = honest(&mlp, &train, &params, 7, Compression::None);
        assert!(
            compare(&across, &plain, Compression::None).is_err(),
            "the branch moves it beyond rounding"
        );
        assert_eq!(
            verify(&mlp, &train, &claim(&params, &across, 7)).expect("computes"),
            Ok(())
        );
    }
}
