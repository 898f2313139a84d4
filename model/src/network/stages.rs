//! The network as another executor needs it: a tab's GPU (`worker-wasm/src/gpu`) runs
//! each layer's forward and backward as its own kernels, so it needs every layer's kind,
//! shapes and parameters, and the dropout masks the CPU path would draw.

use std::ops::Range;

use super::{Network, Part};
use crate::layers::dropout;
use crate::spec::{Layer, Shape};

/// One layer as an executor runs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stage {
    pub layer: Layer,
    pub input: Shape,
    pub output: Shape,
    /// Its weight then bias in the full layout (empty without parameters).
    pub params: (usize, usize),
    /// Whether its parameters are trained (a gradient is computed for them).
    pub trained: bool,
}

impl Stage {
    /// The range of its weight in the full layout, and of its bias after it.
    pub fn weight_and_bias(&self) -> (Range<usize>, Range<usize>) {
        let (start, end) = self.params;
        let bias = self.output.c.min(end - start);
        (start..end - bias, end - bias..end)
    }
}

impl Network {
    /// Every layer, input first (a chain's; a GPT has its own plan).
    pub fn stages(&self) -> Vec<Stage> {
        let Some(chain) = self.chain() else {
            return Vec::new();
        };
        chain
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let range = chain.ranges[i].clone();
                Stage {
                    layer: l.layer,
                    input: chain.shapes[i],
                    output: chain.shapes[i + 1],
                    params: (range.start, range.end),
                    trained: l.layer.has_params() && !l.frozen,
                }
            })
            .collect()
    }

    /// The dropout layer `index`'s multiplier for every value of its output for the rows
    /// of `part` (row-major), while training with the batch's `seed`: 0 where a value is
    /// dropped, `1 / (1 - p)` (as the CPU path computes it) where kept. `None` for a layer
    /// that is not dropout.
    pub fn dropout_mask(&self, index: usize, seed: u64, part: Part) -> Option<Vec<f32>> {
        let chain = self.chain()?;
        let Layer::Dropout { p } = chain.layers.get(index)?.layer else {
            return None;
        };
        let ctx = chain.ctx(index, Some(seed), part.start);
        Some(dropout::mask(&ctx, p, part.end - part.start))
    }
}
