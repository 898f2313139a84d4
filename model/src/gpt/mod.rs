//! GPT-2's architecture, exactly: token and learned position embeddings, pre-LayerNorm
//! blocks (causal multi-head self-attention, then a 4× MLP with GELU's tanh form, each with
//! a residual), a final LayerNorm, and the output head tied to the token embedding, with
//! softmax cross-entropy at every position.
//!
//! A sample is a window of `context + 1` token ids (as values of the input row): the model
//! reads the first `context` and predicts the last `context`. The parameters are named and
//! laid out as GPT-2's (`wte.weight`, `h.0.attn.c_attn.weight` `[in, out]`, ...), so
//! `export` writes them for Hugging Face `transformers` as they are.
//!
//! The network is not a chain of layers: the head reads the embedding's tensor, and every
//! block reads the residual stream twice. It is its own arm of [`NetSpec`](crate::NetSpec)
//! and of [`Network`](crate::Network)'s body, which hands every pass to [`Gpt`] whole.

use std::fmt;

use crate::params::ParamLayout;
use crate::rng::SplitMix64;
use crate::scalar::Scalar;

mod ops;
mod pass;
pub mod sample;

pub use pass::Activations;
pub use sample::Sampling;

/// GPT-2's LayerNorm epsilon (`layer_norm_epsilon`).
pub const LN_EPS: f64 = 1e-5;

/// A GPT's shape: what `--model gpt` and the spec's text name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GptSpec {
    /// Distinct tokens (`vocab_size`).
    pub vocab: usize,
    /// Positions a sample predicts (`n_positions`, nanoGPT's `block_size`).
    pub context: usize,
    /// Transformer blocks (`n_layer`).
    pub layers: usize,
    /// Attention heads per block (`n_head`); they divide the width.
    pub heads: usize,
    /// The residual stream's width (`n_embd`).
    pub width: usize,
}

impl GptSpec {
    /// nanoGPT's CPU configuration (4 layers, 4 heads, width 128, context 64).
    pub fn cpu(vocab: usize) -> Self {
        Self {
            vocab,
            context: 64,
            layers: 4,
            heads: 4,
            width: 128,
        }
    }

    /// nanoGPT's `shakespeare_char` configuration (6 layers, 6 heads, width 384, context 256).
    pub fn shakespeare_char(vocab: usize) -> Self {
        Self {
            vocab,
            context: 256,
            layers: 6,
            heads: 6,
            width: 384,
        }
    }

    /// Why this shape cannot be built, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        let Self {
            vocab,
            context,
            layers,
            heads,
            width,
        } = *self;
        if vocab < 2 || context == 0 || layers == 0 || heads == 0 || width == 0 {
            return Err(
                "vocab must be at least 2, and context, layers, heads and width at least 1".into(),
            );
        }
        if width % heads != 0 {
            return Err(format!("{heads} heads do not divide the width {width}"));
        }
        Ok(())
    }

    /// Parameters, counted without overflow (`None` past `usize`).
    pub fn param_count(&self) -> Option<usize> {
        let c = self.width;
        let block = c
            .checked_mul(c)?
            .checked_mul(12)?
            .checked_add(c.checked_mul(13)?)?;
        self.vocab
            .checked_add(self.context)?
            .checked_mul(c)?
            .checked_add(block.checked_mul(self.layers)?)?
            .checked_add(2 * c)
    }
}

impl fmt::Display for GptSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "gpt vocab {} context {} layers {} heads {} width {}",
            self.vocab, self.context, self.layers, self.heads, self.width
        )
    }
}

/// Where one block's tensors lie in the flat parameters (the offset of each's first value).
#[derive(Debug, Clone, PartialEq)]
pub struct BlockAt {
    pub ln1_g: usize,
    pub ln1_b: usize,
    pub attn_w: usize,
    pub attn_b: usize,
    pub proj_w: usize,
    pub proj_b: usize,
    pub ln2_g: usize,
    pub ln2_b: usize,
    pub fc_w: usize,
    pub fc_b: usize,
    pub mlp_w: usize,
    pub mlp_b: usize,
}

/// A GPT: its shape and where each tensor lies in the flat parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpt {
    spec: GptSpec,
    layout: ParamLayout,
    wte: usize,
    wpe: usize,
    blocks: Vec<BlockAt>,
    lnf_g: usize,
    lnf_b: usize,
}

impl Gpt {
    /// Lays out the parameters of a checked shape, in GPT-2's names and order.
    pub fn new(spec: GptSpec) -> Result<Self, String> {
        spec.check()?;
        let (v, t, c) = (spec.vocab, spec.context, spec.width);
        let mut layout = ParamLayout::default();
        let at = |layout: &mut ParamLayout, name: String, shape: Vec<usize>| {
            let offset = layout.total();
            layout.push(name, shape);
            offset
        };
        let wte = at(&mut layout, "wte.weight".into(), vec![v, c]);
        let wpe = at(&mut layout, "wpe.weight".into(), vec![t, c]);
        let mut blocks = Vec::with_capacity(spec.layers);
        for i in 0..spec.layers {
            let mut p =
                |name: &str, shape: Vec<usize>| at(&mut layout, format!("h.{i}.{name}"), shape);
            blocks.push(BlockAt {
                ln1_g: p("ln_1.weight", vec![c]),
                ln1_b: p("ln_1.bias", vec![c]),
                attn_w: p("attn.c_attn.weight", vec![c, 3 * c]),
                attn_b: p("attn.c_attn.bias", vec![3 * c]),
                proj_w: p("attn.c_proj.weight", vec![c, c]),
                proj_b: p("attn.c_proj.bias", vec![c]),
                ln2_g: p("ln_2.weight", vec![c]),
                ln2_b: p("ln_2.bias", vec![c]),
                fc_w: p("mlp.c_fc.weight", vec![c, 4 * c]),
                fc_b: p("mlp.c_fc.bias", vec![4 * c]),
                mlp_w: p("mlp.c_proj.weight", vec![4 * c, c]),
                mlp_b: p("mlp.c_proj.bias", vec![c]),
            });
        }
        let lnf_g = at(&mut layout, "ln_f.weight".into(), vec![c]);
        let lnf_b = at(&mut layout, "ln_f.bias".into(), vec![c]);
        Ok(Self {
            spec,
            layout,
            wte,
            wpe,
            blocks,
            lnf_g,
            lnf_b,
        })
    }

    pub fn spec(&self) -> &GptSpec {
        &self.spec
    }

    pub fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    /// Where the token and position embeddings lie in the flat parameters.
    pub fn embeddings_at(&self) -> (usize, usize) {
        (self.wte, self.wpe)
    }

    /// Where each block's tensors lie.
    pub fn blocks_at(&self) -> &[BlockAt] {
        &self.blocks
    }

    /// Where the final LayerNorm's gain and bias lie.
    pub fn final_norm_at(&self) -> (usize, usize) {
        (self.lnf_g, self.lnf_b)
    }

    /// GPT-2's initialisation: weights and embeddings from `N(0, 0.02)`, each residual
    /// projection's (`c_proj`) from `N(0, 0.02 / sqrt(2 · layers))`, biases 0, LayerNorm
    /// gains 1. Normal values by Box-Muller on `libm`, so every platform draws the same.
    pub fn init<T: Scalar>(&self, seed: u64) -> Vec<T> {
        let mut rng = SplitMix64::new(seed);
        let mut params = vec![T::zero(); self.layout.total()];
        let proj_std = 0.02 / (2.0 * self.spec.layers as f64).sqrt();
        for spec in self.layout.tensors() {
            let name = spec.name.as_str();
            let values = &mut params[spec.range()];
            if name.ends_with("ln_1.weight")
                || name.ends_with("ln_2.weight")
                || name == "ln_f.weight"
            {
                values.fill(T::one());
            } else if name.ends_with(".bias") {
                continue;
            } else {
                let std = if name.ends_with("c_proj.weight") {
                    proj_std
                } else {
                    0.02
                };
                for v in values.iter_mut() {
                    *v = T::from_f64(normal(&mut rng) * std).unwrap_or_else(T::zero);
                }
            }
        }
        params
    }

    /// Whether a tensor takes weight decay (nanoGPT's rule: the matrices of the blocks, not
    /// biases, LayerNorms or the embeddings).
    pub fn decays(name: &str) -> bool {
        name.starts_with("h.") && name.ends_with(".weight") && !name.contains(".ln_")
    }
}

/// One draw of `N(0, 1)` (Box-Muller).
fn normal(rng: &mut SplitMix64) -> f64 {
    let u1 = 1.0 - rng.next_f64(); // (0, 1]: its logarithm is finite.
    let u2 = rng.next_f64();
    libm::sqrt(-2.0 * libm::log(u1)) * libm::cos(2.0 * std::f64::consts::PI * u2)
}

#[cfg(test)]
mod tests;
