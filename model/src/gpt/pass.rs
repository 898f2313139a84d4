//! The whole GPT forward and backward over a batch of windows.

use ndarray::{s, Array2, ArrayView1, ArrayView2, Axis};

use super::ops::{
    self, attention, attention_backward, layer_norm, layer_norm_backward, linear, linear_backward,
};
use super::{BlockAt, Gpt};
use crate::error::ModelError;
use crate::scalar::Scalar;

/// What one block's backward needs of its forward.
#[derive(Debug)]
struct BlockActs<T> {
    /// The residual stream coming in.
    x: Array2<T>,
    ln1: Array2<T>,
    ln1_stats: Vec<(T, T)>,
    qkv: Array2<T>,
    att: Array2<T>,
    /// The heads' outputs, before the projection.
    y: Array2<T>,
    /// The stream after the attention's residual.
    mid: Array2<T>,
    ln2: Array2<T>,
    ln2_stats: Vec<(T, T)>,
    fc: Array2<T>,
    /// GELU's `tanh` of each of `fc` (`ops::gelu_tanh`): the backward needs no `exp`, and
    /// GELU's output is `fc` and this again, exactly.
    gelu_tanh: Array2<T>,
}

impl<T: Scalar> BlockActs<T> {
    /// GELU's output, from what the pass kept: the forward's values bit for bit.
    fn gelu(&self) -> Array2<T> {
        ndarray::Zip::from(&self.fc)
            .and(&self.gelu_tanh)
            .map_collect(|&x, &t| ops::gelu_from(x, t))
    }
}

/// A forward pass kept for its backward.
#[derive(Debug)]
pub struct Activations<T> {
    tokens: Vec<usize>,
    targets: Vec<usize>,
    blocks: Vec<BlockActs<T>>,
    /// The stream after the last block, and its final LayerNorm.
    last: Array2<T>,
    lnf: Array2<T>,
    lnf_stats: Vec<(T, T)>,
    /// `[rows, vocab]`: one row per position of every window.
    pub logits: Array2<T>,
}

impl Gpt {
    fn tensor<'a, T>(
        &self,
        params: &'a [T],
        offset: usize,
        rows: usize,
        cols: usize,
    ) -> ArrayView2<'a, T> {
        ArrayView2::from_shape((rows, cols), &params[offset..offset + rows * cols]).expect("layout")
    }

    fn vector<'a, T>(&self, params: &'a [T], offset: usize, len: usize) -> &'a [T] {
        &params[offset..offset + len]
    }

    /// The input windows' token ids and targets: each row is `context + 1` ids (or just
    /// `context`, to read without targets), every one a whole number below the vocabulary.
    pub fn tokens<T: Scalar>(
        &self,
        x: ArrayView2<'_, T>,
        with_targets: bool,
    ) -> Result<(Vec<usize>, Vec<usize>), ModelError> {
        let t = self.spec.context;
        let width = t + usize::from(with_targets);
        if x.ncols() != width {
            return Err(ModelError::ShapeMismatch {
                what: "tokens per window",
                expected: width,
                got: x.ncols(),
            });
        }
        if x.nrows() == 0 {
            return Err(ModelError::EmptyBatch);
        }
        let mut tokens = Vec::with_capacity(x.nrows() * t);
        let mut targets = Vec::with_capacity(if with_targets { x.nrows() * t } else { 0 });
        for (i, row) in x.rows().into_iter().enumerate() {
            for (j, &v) in row.iter().enumerate() {
                let id = v
                    .to_usize()
                    .filter(|&id| T::from_usize(id) == Some(v) && id < self.spec.vocab);
                let id = id.ok_or(ModelError::TokenOutOfRange {
                    index: i * width + j,
                    vocab: self.spec.vocab,
                })?;
                if j < t {
                    tokens.push(id);
                }
                if with_targets && j > 0 {
                    targets.push(id);
                }
            }
        }
        Ok((tokens, targets))
    }

    /// The forward pass over windows of token ids (`[samples, context + 1]`, or `context`
    /// without targets), keeping every block's activations for the backward pass.
    pub fn forward<T: Scalar>(
        &self,
        params: &[T],
        x: ArrayView2<'_, T>,
        with_targets: bool,
    ) -> Result<Activations<T>, ModelError> {
        self.pass(params, x, with_targets, true)
    }

    /// The same pass for scoring and sampling: each block's activations are dropped once
    /// the next block has its input, so it holds one block's at a time (a 10.7M model's 256
    /// validation windows kept every block's, about 2.3 GB a block). Only the logits, the
    /// targets and the last stream are kept; the result cannot go to [`Gpt::backward`].
    pub fn forward_inference<T: Scalar>(
        &self,
        params: &[T],
        x: ArrayView2<'_, T>,
        with_targets: bool,
    ) -> Result<Activations<T>, ModelError> {
        self.pass(params, x, with_targets, false)
    }

    fn pass<T: Scalar>(
        &self,
        params: &[T],
        x: ArrayView2<'_, T>,
        with_targets: bool,
        keep_blocks: bool,
    ) -> Result<Activations<T>, ModelError> {
        if params.len() != self.layout.total() {
            return Err(ModelError::ShapeMismatch {
                what: "parameters",
                expected: self.layout.total(),
                got: params.len(),
            });
        }
        let (tokens, targets) = self.tokens(x, with_targets)?;
        let (v, t, c) = (self.spec.vocab, self.spec.context, self.spec.width);
        let wte = self.tensor(params, self.wte, v, c);
        let wpe = self.tensor(params, self.wpe, t, c);
        let mut h = Array2::zeros((tokens.len(), c));
        for (n, (mut row, &id)) in h.rows_mut().into_iter().zip(&tokens).enumerate() {
            for ((o, &e), &p) in row.iter_mut().zip(wte.row(id)).zip(wpe.row(n % t)) {
                *o = e + p;
            }
        }
        let mut blocks = Vec::with_capacity(self.blocks.len());
        for at in &self.blocks {
            let acts = self.block_forward(params, at, h);
            let gelu = acts.gelu();
            h = acts.mid.clone()
                + &linear(
                    gelu.view(),
                    self.tensor(params, at.mlp_w, 4 * c, c),
                    ArrayView1::from(self.vector(params, at.mlp_b, c)),
                );
            if keep_blocks {
                blocks.push(acts);
            }
        }
        let (lnf, lnf_stats) = layer_norm(
            h.view(),
            self.vector(params, self.lnf_g, c),
            self.vector(params, self.lnf_b, c),
        );
        let mut logits = Array2::zeros((tokens.len(), v));
        crate::gemm::gemm(T::one(), &lnf, &wte.t(), T::zero(), &mut logits.view_mut());
        Ok(Activations {
            tokens,
            targets,
            blocks,
            last: h,
            lnf,
            lnf_stats,
            logits,
        })
    }

    /// One block up to its MLP's GELU (the caller adds the MLP's projection).
    fn block_forward<T: Scalar>(&self, params: &[T], at: &BlockAt, x: Array2<T>) -> BlockActs<T> {
        let c = self.spec.width;
        let v = |o: usize, n: usize| self.vector(params, o, n);
        let (ln1, ln1_stats) = layer_norm(x.view(), v(at.ln1_g, c), v(at.ln1_b, c));
        let qkv = linear(
            ln1.view(),
            self.tensor(params, at.attn_w, c, 3 * c),
            ArrayView1::from(v(at.attn_b, 3 * c)),
        );
        let (y, att) = attention(qkv.view(), self.spec.context, self.spec.heads);
        let mid = linear(
            y.view(),
            self.tensor(params, at.proj_w, c, c),
            ArrayView1::from(v(at.proj_b, c)),
        ) + &x;
        let (ln2, ln2_stats) = layer_norm(mid.view(), v(at.ln2_g, c), v(at.ln2_b, c));
        let fc = linear(
            ln2.view(),
            self.tensor(params, at.fc_w, c, 4 * c),
            ArrayView1::from(v(at.fc_b, 4 * c)),
        );
        let gelu_tanh = fc.mapv(ops::gelu_tanh);
        BlockActs {
            x,
            ln1,
            ln1_stats,
            qkv,
            att,
            y,
            mid,
            ln2,
            ln2_stats,
            fc,
            gelu_tanh,
        }
    }

    /// The summed cross-entropy of every position of the pass, and the number of positions
    /// whose most likely token is the target.
    pub fn loss_sum_and_correct<T: Scalar>(&self, acts: &Activations<T>) -> (T, usize) {
        let correct = acts
            .logits
            .rows()
            .into_iter()
            .zip(&acts.targets)
            .filter(|(row, &t)| {
                let best = row
                    .iter()
                    .enumerate()
                    .fold(
                        (0, T::neg_infinity()),
                        |b, (i, &v)| if v > b.1 { (i, v) } else { b },
                    );
                best.0 == t
            })
            .count();
        let mut logits = acts.logits.clone();
        (
            ops::cross_entropy(&mut logits, &acts.targets, None),
            correct,
        )
    }

    /// The backward pass: the rows' share of the mean loss of a batch of `batch` windows
    /// (each window's loss the mean over its positions), and its gradient in the layout
    /// (every value of `grads` written).
    pub fn backward<T: Scalar>(
        &self,
        params: &[T],
        acts: Activations<T>,
        batch: usize,
        grads: &mut Vec<T>,
    ) -> Result<T, ModelError> {
        let (v, t, c) = (self.spec.vocab, self.spec.context, self.spec.width);
        let samples = acts.tokens.len() / t;
        if batch < samples {
            return Err(ModelError::ShapeMismatch {
                what: "rows of a part of a batch (at most the batch)",
                expected: batch,
                got: samples,
            });
        }
        let positions = T::from_usize(batch * t).ok_or(ModelError::EmptyBatch)?;
        let scale = T::one() / positions;
        grads.clear();
        grads.resize(self.layout.total(), T::zero());
        let Activations {
            tokens,
            targets,
            blocks,
            last,
            lnf,
            lnf_stats,
            mut logits,
        } = acts;
        let loss = ops::cross_entropy(&mut logits, &targets, Some(scale)) * scale;
        let dlogits = logits;
        let wte = self.tensor(params, self.wte, v, c);
        // The head: logits = lnf · wteᵀ.
        {
            let dwte = &mut grads[self.wte..self.wte + v * c];
            let mut dwte = ndarray::ArrayViewMut2::from_shape((v, c), dwte).expect("layout");
            crate::gemm::gemm(T::one(), &dlogits.t(), &lnf, T::zero(), &mut dwte);
        }
        let mut dlnf = Array2::zeros((dlogits.nrows(), c));
        crate::gemm::gemm(T::one(), &dlogits, &wte, T::zero(), &mut dlnf.view_mut());
        let (dg, db) = split_pair(grads, self.lnf_g, self.lnf_b, c, c);
        let mut dh = layer_norm_backward(
            last.view(),
            &lnf_stats,
            self.vector(params, self.lnf_g, c),
            dlnf.view(),
            dg,
            db,
        );
        for (at, a) in self.blocks.iter().zip(&blocks).rev() {
            dh = self.block_backward(params, at, a, dh, grads);
        }
        // The embeddings: each row's gradient to its token's and its position's row, rows in order.
        let mut dwpe = vec![T::zero(); t * c];
        for (n, (row, &id)) in dh.axis_iter(Axis(0)).zip(&tokens).enumerate() {
            let tok = &mut grads[self.wte + id * c..self.wte + (id + 1) * c];
            for (g, &d) in tok.iter_mut().zip(row) {
                *g += d;
            }
            let pos = &mut dwpe[(n % t) * c..(n % t + 1) * c];
            for (g, &d) in pos.iter_mut().zip(row) {
                *g += d;
            }
        }
        grads[self.wpe..self.wpe + t * c].copy_from_slice(&dwpe);
        Ok(loss)
    }

    fn block_backward<T: Scalar>(
        &self,
        params: &[T],
        at: &BlockAt,
        a: &BlockActs<T>,
        dh: Array2<T>,
        grads: &mut [T],
    ) -> Array2<T> {
        let c = self.spec.width;
        // MLP: out = mid + gelu(fc(ln2(mid))) · W + b.
        let (dw, db) = split_pair(grads, at.mlp_w, at.mlp_b, 4 * c * c, c);
        let dgelu = linear_backward(
            a.gelu().view(),
            self.tensor(params, at.mlp_w, 4 * c, c),
            dh.view(),
            dw,
            db,
        );
        let mut dfc = dgelu;
        ndarray::Zip::from(&mut dfc)
            .and(&a.fc)
            .and(&a.gelu_tanh)
            .for_each(|d, &x, &t| *d *= ops::gelu_slope_from(x, t));
        let (dw, db) = split_pair(grads, at.fc_w, at.fc_b, c * 4 * c, 4 * c);
        let dln2 = linear_backward(
            a.ln2.view(),
            self.tensor(params, at.fc_w, c, 4 * c),
            dfc.view(),
            dw,
            db,
        );
        let (dg, db) = split_pair(grads, at.ln2_g, at.ln2_b, c, c);
        let dmid = dh
            + &layer_norm_backward(
                a.mid.view(),
                &a.ln2_stats,
                self.vector(params, at.ln2_g, c),
                dln2.view(),
                dg,
                db,
            );
        // Attention: mid = x + proj(attention(qkv(ln1(x)))).
        let (dw, db) = split_pair(grads, at.proj_w, at.proj_b, c * c, c);
        let dy = linear_backward(
            a.y.view(),
            self.tensor(params, at.proj_w, c, c),
            dmid.view(),
            dw,
            db,
        );
        let dqkv = attention_backward(
            a.qkv.view(),
            a.att.view(),
            dy.view(),
            self.spec.context,
            self.spec.heads,
        );
        let (dw, db) = split_pair(grads, at.attn_w, at.attn_b, c * 3 * c, 3 * c);
        let dln1 = linear_backward(
            a.ln1.view(),
            self.tensor(params, at.attn_w, c, 3 * c),
            dqkv.view(),
            dw,
            db,
        );
        let (dg, db) = split_pair(grads, at.ln1_g, at.ln1_b, c, c);
        dmid + &layer_norm_backward(
            a.x.view(),
            &a.ln1_stats,
            self.vector(params, at.ln1_g, c),
            dln1.view(),
            dg,
            db,
        )
    }

    /// The logits at the last position of each window of `context` ids or fewer (what
    /// sampling needs): `[samples, vocab]`.
    pub fn next_logits<T: Scalar>(
        &self,
        params: &[T],
        ids: &[usize],
    ) -> Result<Vec<T>, ModelError> {
        let t = self.spec.context;
        let window = &ids[ids.len().saturating_sub(t)..];
        if window.is_empty() {
            return Err(ModelError::EmptyBatch);
        }
        // Left-aligned and padded with token 0: causal attention never reads the padding.
        let mut x = Array2::zeros((1, t));
        for (o, &id) in x.iter_mut().zip(window) {
            *o = T::from_usize(id).ok_or(ModelError::TokenOutOfRange {
                index: 0,
                vocab: self.spec.vocab,
            })?;
        }
        let acts = self.forward_inference(params, x.view(), false)?;
        Ok(acts.logits.slice(s![window.len() - 1, ..]).to_vec())
    }
}

/// Two adjacent tensors' gradients, at `a` and `b`, mutably.
fn split_pair<T>(
    grads: &mut [T],
    a: usize,
    b: usize,
    a_len: usize,
    b_len: usize,
) -> (&mut [T], &mut [T]) {
    debug_assert_eq!(a + a_len, b);
    let (head, tail) = grads[a..b + b_len].split_at_mut(a_len);
    (head, tail)
}
