//! The branches a forward pass took at its near-ties, logged by a worker whose float order
//! nobody replays (a tab's GPU), and forced on the replay of its segments
//! (docs/DESIGN.md, "A GPU's local phase, checked by segments").
//!
//! A ReLU model's phase computed in another float order drifts from its replay wherever a
//! ReLU's input or a max-pool window's two largest values are within rounding of each
//! other: the two machines take different branches, and every later step of the segment
//! differs by far more than rounding. So the worker logs, each step, the branch it took at
//! each near-tie of its forward pass (what [`Network::loss_grad_envelope`] finds: a margin
//! within `TIE_MARGIN` (2e-5) of its row's largest magnitude, exact ties every machine computes
//! alike left out), the closest [`MAX_BRANCHES`]. The replay
//! ([`Network::loss_and_grad_forced`]) takes a logged branch where its own margin there is
//! within [`FORCE_MARGIN`], by moving the one value by at most that margin (a ReLU's input
//! to just above or to zero, a pool's winner to just above its rival), and refuses a logged
//! branch its own pass finds farther from a tie than that: rounding could not have taken
//! it. A logged branch the replay takes anyway changes nothing.
//!
//! One ReLU input is often computed many times over: a convolution's filter over the
//! uniform background of a digit gives the same value at every background position, on
//! every machine bit for bit alike, so where that value is near zero all of them are
//! near-ties at once and flip together (measured: up to 750 a step at batches of 8 on
//! the `cnn` preset). The log keeps one of each such group (a channel's units of one
//! sample with the same value), and the replay spreads a forced branch to the units of
//! the same channel and sample whose value is the same as the logged one's.
//!
//! What a log lets a cheater do: pick, at units within [`FORCE_MARGIN`] of a tie on the
//! verifier, which side each falls on; each such pick moves one activation (or its group
//! of equal ones) by at most that share of its row's largest magnitude, at most
//! [`MAX_BRANCHES`] a step.

use std::collections::{HashMap, HashSet};

use ndarray::{Array2, ArrayView2};

use super::chain::Chain;
use super::ties::scale;
use super::{standard, Network, Part, Pass};
use crate::error::ModelError;
use crate::scalar::Scalar;
use crate::spec::Layer;

/// A logged branch is forced where the replay's own margin is at most this share of its
/// row's largest magnitude (about 30 units of f32 rounding of the row's largest value: a
/// flip between two float orders has both margins within their activations' difference).
/// Farther, the replay refuses it; the segment check calls a margin up to 5 times what a
/// worker logs marginal, not a mismatch.
pub const FORCE_MARGIN: f64 = 2e-6;
/// Branches a step logs at most (the closest near-ties): 20 KB of log a step.
pub const MAX_BRANCHES: usize = 1024;

/// The branch a forward pass took at one near-tie.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Branch {
    /// The ReLU or max-pool layer (its index in the spec; never the first layer).
    pub layer: u32,
    /// The sample: its row in the batch.
    pub row: u32,
    /// A ReLU's unit (a column of its input); a max-pool's candidate that lost to `taken`.
    pub col: u32,
    /// A ReLU's 1 (open: its input above zero) or 0 (closed); a max-pool's winner (a
    /// column of its input).
    pub taken: u32,
}

/// What forcing a log did to a replay.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Forced {
    /// Logged branches the replay took because they were forced.
    pub followed: usize,
    /// Logged branches the replay took on its own.
    pub agreed: usize,
    /// The widest margin a forced branch had on the replay (a share of its row's scale).
    pub widest: f64,
    /// The first logged branch the replay could not take, and why.
    pub refused: Option<(Branch, Refusal)>,
}

/// Why a replay refuses a logged branch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Refusal {
    /// Not a ReLU's or a max-pool's unit of this model and batch.
    NotABranch,
    /// More than [`MAX_BRANCHES`] for one step.
    TooMany,
    /// The other branch, by this margin (beyond [`FORCE_MARGIN`]): rounding cannot explain it.
    Far(f64),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotABranch => write!(f, "not a ReLU's or a max-pool's unit of this model"),
            Self::TooMany => write!(f, "more than {MAX_BRANCHES} branches logged for one step"),
            Self::Far(m) => write!(
                f,
                "the replay takes the other branch {m:.2e} of its row from a tie (at most {FORCE_MARGIN:.0e})"
            ),
        }
    }
}

impl Network {
    /// Whether the model has branches a float order can flip (ReLUs and max-pools after
    /// its first layer): its GPU phases log them.
    pub fn has_branches(&self) -> bool {
        self.chain()
            .is_some_and(|c| (1..c.layers.len()).any(|i| c.is_branch_layer(i)))
    }

    /// The branches the forward pass of a training step (dropout from `seed`) takes at its
    /// near-ties, on this machine: the log of a step computed here.
    pub fn branches<T: Scalar>(
        &self,
        params: &[T],
        x: ArrayView2<'_, T>,
        seed: u64,
    ) -> Result<Vec<Branch>, ModelError> {
        self.check(params, &x)?;
        if !self.has_branches() {
            return Ok(Vec::new());
        }
        let Some(chain) = self.chain() else {
            return Ok(Vec::new());
        };
        let x = standard(x);
        let outs = chain.forward_all(params, x.view(), Some(seed), Part::whole(x.nrows()));
        self.branches_in(x.view(), &outs)
    }

    /// The branches a forward pass computed elsewhere (a GPU's) took: `outs[i]` is layer
    /// `i`'s output for every row of the standardised batch `x`. The closest
    /// [`MAX_BRANCHES`], in order of layer, row and column.
    pub fn branches_in<T: Scalar>(
        &self,
        x: ArrayView2<'_, T>,
        outs: &[Array2<T>],
    ) -> Result<Vec<Branch>, ModelError> {
        if x.ncols() != self.inputs() {
            return Err(ModelError::ShapeMismatch {
                what: "input features",
                expected: self.inputs(),
                got: x.ncols(),
            });
        }
        let layers = self.spec.layers().len();
        let chain = self.chain().filter(|_| outs.len() == layers);
        let Some(chain) = chain else {
            return Err(ModelError::ShapeMismatch {
                what: "activation arrays",
                expected: layers,
                got: outs.len(),
            });
        };
        for (i, out) in outs.iter().enumerate() {
            let cols = chain.shapes[i + 1].len();
            if out.dim() != (x.nrows(), cols) {
                return Err(ModelError::ShapeMismatch {
                    what: "activations of a layer",
                    expected: x.nrows() * cols,
                    got: out.len(),
                });
            }
        }
        let mut ties = chain.near_ties(x, outs);
        ties.sort_by(|a, b| a.margin.total_cmp(&b.margin));
        // One of each group of a channel's equal ReLU inputs (they flip together).
        let mut groups = HashSet::new();
        ties.retain(|t| {
            let layer = t.array + 1;
            if chain.layers[layer].layer != Layer::Relu {
                return true;
            }
            let value = outs[t.array][[t.row, t.col]].to_f64().unwrap_or(f64::NAN);
            let channel = t.col / chain.plane(layer);
            groups.insert((t.array, t.row, channel, value.to_bits()))
        });
        ties.truncate(MAX_BRANCHES);
        let mut branches: Vec<Branch> = ties
            .iter()
            .map(|t| Branch {
                layer: (t.array + 1) as u32,
                row: t.row as u32,
                col: t.col as u32,
                taken: t.taken as u32,
            })
            .collect();
        branches.sort_unstable();
        Ok(branches)
    }

    /// [`Network::loss_and_grad`] with the `logged` branches of one step forced where the
    /// replay's own margin is within [`FORCE_MARGIN`]; what it did says [`Forced`], whose
    /// `refused` (the first branch it could not take) makes the step not the worker's.
    pub fn loss_and_grad_forced<T: Scalar>(
        &self,
        params: &[T],
        x: ArrayView2<'_, T>,
        labels: &[u8],
        seed: u64,
        logged: &[Branch],
    ) -> Result<(T, Vec<T>, Forced), ModelError> {
        self.check(params, &x)?;
        let mut forced = Forced::default();
        if let Some(&b) = logged.first() {
            if logged.len() > MAX_BRANCHES {
                forced.refused = Some((b, Refusal::TooMany));
            }
        }
        let chain = self.chain();
        let branch = |b: &&Branch| chain.is_some_and(|c| c.is_branch_layer(b.layer as usize));
        if let Some(&b) = logged.iter().find(|b| !branch(b)) {
            forced.refused.get_or_insert((b, Refusal::NotABranch));
        }
        let Some(chain) = chain else {
            let (loss, grads) = self.loss_and_grad(params, x, labels, seed)?;
            return Ok((loss, grads, forced));
        };
        let x = standard(x);
        let whole = Part::whole(x.nrows());
        let outs = chain.forward_with(params, x.view(), Some(seed), whole, |i, input| {
            let mut scales = HashMap::new();
            for b in logged.iter().filter(|b| b.layer as usize == i) {
                chain.force(i, input, b, &mut scales, &mut forced);
            }
        });
        let (loss, grads) =
            chain.backward_all(params, x.view(), &outs, labels, seed, whole, Pass::Gradient)?;
        Ok((loss, grads, forced))
    }
}

impl Chain {
    /// Whether layer `i` is a ReLU or a max-pool after the first layer.
    fn is_branch_layer(&self, i: usize) -> bool {
        i > 0
            && self
                .layers
                .get(i)
                .is_some_and(|l| matches!(l.layer, Layer::Relu | Layer::MaxPool { .. }))
    }

    /// Values in one channel of layer `i`'s input (1 after a dense layer).
    fn plane(&self, i: usize) -> usize {
        let shape = self.shapes[i];
        (shape.h * shape.w).max(1)
    }

    /// Takes branch `b` in layer `i`'s `input`, if its margin there allows (a ReLU's, at
    /// the units of its channel equal to it too). `scales` keeps each row's scale, found
    /// before anything in it moved.
    fn force<T: Scalar>(
        &self,
        i: usize,
        input: &mut Array2<T>,
        b: &Branch,
        scales: &mut HashMap<usize, f64>,
        forced: &mut Forced,
    ) {
        let (row, col, taken) = (b.row as usize, b.col as usize, b.taken as usize);
        let cols = input.ncols();
        let pool = !matches!(self.layers[i].layer, Layer::Relu);
        let valid = row < input.nrows()
            && col < cols
            && if pool {
                taken < cols && taken != col
            } else {
                taken <= 1
            };
        if !valid {
            forced.refused.get_or_insert((*b, Refusal::NotABranch));
            return;
        }
        let scale = *scales
            .entry(row)
            .or_insert_with(|| scale(input.row(row).iter().copied()));
        let v = input[[row, col]];
        // Whether the replay takes it on its own, and the value that makes it take it.
        let (agrees, margin, at, value) = if pool {
            // The pool's rule: the largest, the first of equals (the window's own order).
            let w = input[[row, taken]];
            let agrees = w > v || (w == v && taken < col);
            let step =
                (v.abs() * T::epsilon() * (T::one() + T::one())).max(T::min_positive_value());
            (agrees, (v - w).to_f64(), taken, v + step)
        } else {
            let open = taken == 1;
            let value = if open {
                v.abs().max(T::min_positive_value())
            } else {
                T::zero()
            };
            ((v > T::zero()) == open, v.abs().to_f64(), col, value)
        };
        if agrees {
            forced.agreed += 1;
            return;
        }
        let margin = margin.unwrap_or(f64::INFINITY) / scale;
        if margin > FORCE_MARGIN || margin.is_nan() {
            forced.refused.get_or_insert((*b, Refusal::Far(margin)));
            return;
        }
        input[[row, at]] = value;
        forced.followed += 1;
        forced.widest = forced.widest.max(margin);
        // (An exact zero may also be an all-zero patch's, which no machine computes else.)
        if !pool && v != T::zero() {
            let plane = self.plane(i);
            let channel = col / plane * plane;
            for c in channel..(channel + plane).min(cols) {
                if input[[row, c]] == v {
                    input[[row, c]] = value;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
