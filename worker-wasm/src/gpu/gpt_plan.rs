//! A GPT's plan (`gpt.wgsl`, and the dense kernels for its linear layers): where each
//! block's tensors live in the activation buffer, and the kernels of its forward pass,
//! loss and backward pass in the order `model/src/gpt/pass.rs` computes them.
//!
//! `lab` holds the N = samples · context positions' targets, then their tokens; `loss`
//! each position's loss, whose sum over N is the batch's mean loss (every window's loss
//! is the mean over its positions).

use model::gpt::Gpt;

use super::dense;
use super::dispatch::{Dispatch, Plan, TooLarge};

/// Where one block's tensors start in `act` (their gradients at the same offsets in `dact`).
struct BlockActs {
    /// The residual stream coming in.
    x: usize,
    ln1: usize,
    ln1_stats: usize,
    qkv: usize,
    att: usize,
    /// The heads' outputs side by side, before the projection.
    y: usize,
    proj: usize,
    /// The stream after the attention's residual.
    mid: usize,
    ln2: usize,
    ln2_stats: usize,
    fc: usize,
    gelu: usize,
    mlp: usize,
    /// The stream going out (the next block's `x`).
    out: usize,
}

/// A bump allocator over `act`.
struct Acts(usize);

impl Acts {
    fn take(&mut self, values: usize) -> usize {
        let at = self.0;
        self.0 += values;
        at
    }
}

pub(super) fn plan(gpt: &Gpt, samples: usize) -> Result<Plan, TooLarge> {
    let spec = gpt.spec();
    let (v, t, c, heads) = (spec.vocab, spec.context, spec.width, spec.heads);
    let n = samples * t;
    let params = gpt.layout().total();
    let mut acts = Acts(0);
    let h0 = acts.take(n * c);
    let mut blocks = Vec::with_capacity(spec.layers);
    let mut x = h0;
    for _ in 0..spec.layers {
        let b = BlockActs {
            x,
            ln1: acts.take(n * c),
            ln1_stats: acts.take(2 * n),
            qkv: acts.take(n * 3 * c),
            att: acts.take(samples * heads * t * t),
            y: acts.take(n * c),
            proj: acts.take(n * c),
            mid: acts.take(n * c),
            ln2: acts.take(n * c),
            ln2_stats: acts.take(2 * n),
            fc: acts.take(n * 4 * c),
            gelu: acts.take(n * 4 * c),
            mlp: acts.take(n * c),
            out: acts.take(n * c),
        };
        x = b.out;
        blocks.push(b);
    }
    let last = x;
    let lnf = acts.take(n * c);
    let lnf_stats = acts.take(2 * n);
    let logits = acts.take(n * v);
    let (wte, wpe) = gpt.embeddings_at();
    let (lnf_g, lnf_b) = gpt.final_norm_at();
    let weights = gpt.blocks_at();

    let d = Dispatch::new;
    let mut out = vec![d("gpt_embed", n * c, &[c, t, n, wte, wpe, h0])];
    for (b, p) in blocks.iter().zip(weights) {
        let attention = [t, heads, c, b.qkv, b.att, b.y];
        out.extend([
            layer_norm(n, c, (b.x, b.ln1, b.ln1_stats), (p.ln1_g, p.ln1_b)),
            dense::forward(n, (c, 3 * c), (b.ln1, b.qkv), (p.attn_w, p.attn_b)),
            d("attention_forward", samples * heads * t, &attention[..5]),
            d("attention_values", n * c, &attention),
            dense::forward(n, (c, c), (b.y, b.proj), (p.proj_w, p.proj_b)),
            d("add", n * c, &[b.x, b.proj, b.mid]),
            layer_norm(n, c, (b.mid, b.ln2, b.ln2_stats), (p.ln2_g, p.ln2_b)),
            dense::forward(n, (c, 4 * c), (b.ln2, b.fc), (p.fc_w, p.fc_b)),
            d("gelu_tanh_forward", n * 4 * c, &[b.fc, b.gelu]),
            dense::forward(n, (4 * c, c), (b.gelu, b.mlp), (p.mlp_w, p.mlp_b)),
            d("add", n * c, &[b.mid, b.mlp, b.out]),
        ]);
    }
    out.extend([
        layer_norm(n, c, (last, lnf, lnf_stats), (lnf_g, lnf_b)),
        d("gpt_head_forward", n * v, &[v, c, lnf, logits, wte]),
        d("softmax_cross_entropy", n, &[v, n, logits, logits]),
        // The head, tied to the token embedding: its share of dwte first.
        d("gpt_head_weights", v * c, &[v, c, lnf, logits, wte, n]),
        d("gpt_head_input", n * c, &[v, c, lnf, logits, wte]),
    ]);
    out.extend(layer_norm_backward(
        n,
        c,
        (last, lnf_stats, lnf),
        None,
        (lnf_g, lnf_b),
    ));
    for (b, p) in blocks.iter().zip(weights).rev() {
        let attention = [t, heads, c, b.qkv, b.att, b.y];
        // The MLP: out = mid + gelu(fc(ln2(mid)))·W + b.
        out.extend(linear_backward(
            n,
            (4 * c, c),
            (b.gelu, b.out),
            (p.mlp_w, p.mlp_b),
        ));
        out.push(d(
            "gelu_tanh_input",
            n * 4 * c,
            &[b.fc, b.gelu, b.fc, b.gelu],
        ));
        out.extend(linear_backward(
            n,
            (c, 4 * c),
            (b.ln2, b.fc),
            (p.fc_w, p.fc_b),
        ));
        out.extend(layer_norm_backward(
            n,
            c,
            (b.mid, b.ln2_stats, b.ln2),
            Some(b.out),
            (p.ln2_g, p.ln2_b),
        ));
        // The attention: mid = x + proj(attention(qkv(ln1(x)))).
        out.extend(linear_backward(
            n,
            (c, c),
            (b.y, b.mid),
            (p.proj_w, p.proj_b),
        ));
        out.extend([
            d("attention_scores_input", samples * heads * t, &attention),
            d("attention_input", n * 3 * c, &attention),
        ]);
        out.extend(linear_backward(
            n,
            (c, 3 * c),
            (b.ln1, b.qkv),
            (p.attn_w, p.attn_b),
        ));
        out.extend(layer_norm_backward(
            n,
            c,
            (b.x, b.ln1_stats, b.ln1),
            Some(b.mid),
            (p.ln1_g, p.ln1_b),
        ));
    }
    out.push(d(
        "gpt_embed_weights",
        (v + t) * c,
        &[c, t, n, v, h0, wte, wpe],
    ));
    let end = acts.0;
    let largest = end.max(params).max(2 * n);
    if largest > u32::MAX as usize / 2 {
        return Err(TooLarge::Values(largest));
    }
    Ok(Plan {
        rows: n,
        labels: 2 * n,
        params,
        acts: end,
        outputs: Vec::new(),
        dropouts: Vec::new(),
        masks: 0,
        dispatches: out,
    })
}

/// A linear layer's backward (GPT-2's `Conv1D`, `[in, out]`: the dense kernels, whose
/// `forward` is the layer's): the weights' and bias's gradients, then the input's (the
/// gradient at `y` flows to `x`).
fn linear_backward(
    n: usize,
    shape: (usize, usize),
    xy: (usize, usize),
    wb: (usize, usize),
) -> [Dispatch; 2] {
    [
        dense::weights(n, shape, xy, wb),
        dense::input(n, shape, xy, wb.0),
    ]
}

/// LayerNorm of `n` rows of width `c`, from `x` to `y`, keeping each row's statistics, with
/// gain and bias `(g, b)`.
fn layer_norm(
    n: usize,
    c: usize,
    (x, y, stats): (usize, usize, usize),
    (g, b): (usize, usize),
) -> Dispatch {
    Dispatch::new("layer_norm_forward", n, &[c, x, y, stats, g, b])
}

/// Its backward: the input's gradient (plus the residual stream's, `dres`, where the input
/// is also the stream's), then the gain's and bias's.
fn layer_norm_backward(
    n: usize,
    c: usize,
    (x, stats, y): (usize, usize, usize),
    dres: Option<usize>,
    (g, b): (usize, usize),
) -> [Dispatch; 2] {
    let (add, dres) = dres.map_or((0, 0), |at| (1, at));
    [
        Dispatch::new("layer_norm_input", n, &[c, x, stats, y, x, dres, add, g]),
        Dispatch::new("layer_norm_weights", 2 * c, &[c, x, stats, y, g, b, n]),
    ]
}

#[cfg(test)]
mod tests {
    use model::gpt::{Gpt, GptSpec};

    use super::*;

    /// Every tensor of every block is laid out once, the kernels run forward, loss, then
    /// backward block by block in reverse, and every parameter tensor gets its gradient.
    #[test]
    fn a_gpt_plan_lays_out_each_block_and_runs_its_kernels_in_order() {
        let spec = GptSpec {
            vocab: 11,
            context: 8,
            layers: 2,
            heads: 2,
            width: 16,
        };
        let gpt = Gpt::new(spec).expect("a shape");
        let plan = plan(&gpt, 3).expect("plans");
        let (n, c) = (24, 16);
        let block = n * c * 18 + 2 * 2 * n + 3 * 2 * 8 * 8;
        assert_eq!(plan.acts, n * c + 2 * block + n * c + 2 * n + n * 11);
        assert_eq!((plan.rows, plan.labels), (n, 2 * n));
        let kernels: Vec<_> = plan.dispatches.iter().map(|d| d.kernel).collect();
        assert_eq!(kernels[0], "gpt_embed");
        assert_eq!(kernels.len(), 1 + 2 * 11 + 7 + 2 * 15 + 1);
        let loss = kernels
            .iter()
            .position(|k| *k == "softmax_cross_entropy")
            .expect("a loss");
        assert!(kernels[..loss].iter().all(|k| !k.contains("weights")));
        assert_eq!(kernels.last(), Some(&"gpt_embed_weights"));
        // Each parameter tensor's gradient is written by exactly one kernel (wte twice:
        // the head's share, then the embedding's).
        let written: Vec<u32> = plan
            .dispatches
            .iter()
            .flat_map(|d| match d.kernel {
                "dense_weights" => vec![d.p[6], d.p[7]],
                "layer_norm_weights" => vec![d.p[5], d.p[6]],
                "gpt_head_weights" => vec![d.p[5]],
                "gpt_embed_weights" => vec![d.p[6], d.p[7]],
                _ => vec![],
            })
            .collect();
        let mut offsets: Vec<u32> = gpt
            .layout()
            .tensors()
            .iter()
            .map(|t| t.offset as u32)
            .collect();
        offsets.push(gpt.embeddings_at().0 as u32);
        let (mut a, mut b) = (written, offsets);
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b);
    }
}
