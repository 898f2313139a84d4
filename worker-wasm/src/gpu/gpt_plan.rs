//! A GPT's plan (`gpt.wgsl`, and the dense kernels for its linear layers): where each
//! block's tensors live in the activation buffer, and the kernels of its forward pass,
//! loss and backward pass in the order `model/src/gpt/pass.rs` computes them.
//!
//! `lab` holds the N = samples · context positions' targets, then their tokens; `loss`
//! each position's loss, whose sum over N is the batch's mean loss (every window's loss
//! is the mean over its positions).

use model::gpt::Gpt;

use super::plan::{Dispatch, Plan, TooLarge};

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

/// Where one block's parameters start in `w` (and their gradients in `g`).
struct BlockParams {
    ln1_g: usize,
    ln1_b: usize,
    attn_w: usize,
    attn_b: usize,
    proj_w: usize,
    proj_b: usize,
    ln2_g: usize,
    ln2_b: usize,
    fc_w: usize,
    fc_b: usize,
    mlp_w: usize,
    mlp_b: usize,
}

/// A tensor's offset in the flat parameters, by its GPT-2 name.
fn offset(gpt: &Gpt, name: &str) -> usize {
    gpt.layout()
        .tensors()
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("a GPT lays out {name}"))
        .offset
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
    let (wte, wpe) = (offset(gpt, "wte.weight"), offset(gpt, "wpe.weight"));
    let (lnf_g, lnf_b) = (offset(gpt, "ln_f.weight"), offset(gpt, "ln_f.bias"));
    let weights: Vec<BlockParams> = (0..spec.layers)
        .map(|i| {
            let p = |name: &str| offset(gpt, &format!("h.{i}.{name}"));
            BlockParams {
                ln1_g: p("ln_1.weight"),
                ln1_b: p("ln_1.bias"),
                attn_w: p("attn.c_attn.weight"),
                attn_b: p("attn.c_attn.bias"),
                proj_w: p("attn.c_proj.weight"),
                proj_b: p("attn.c_proj.bias"),
                ln2_g: p("ln_2.weight"),
                ln2_b: p("ln_2.bias"),
                fc_w: p("mlp.c_fc.weight"),
                fc_b: p("mlp.c_fc.bias"),
                mlp_w: p("mlp.c_proj.weight"),
                mlp_b: p("mlp.c_proj.bias"),
            }
        })
        .collect();

    let d = Dispatch::new;
    let mut out = vec![d("gpt_embed", n * c, &[c, t, n, wte, wpe, h0])];
    for (b, p) in blocks.iter().zip(&weights) {
        let attention = [t, heads, c, b.qkv, b.att, b.y];
        out.extend([
            d(
                "layer_norm_forward",
                n,
                &[c, b.x, b.ln1, b.ln1_stats, p.ln1_g, p.ln1_b],
            ),
            d(
                "dense_forward",
                n * 3 * c,
                &[n, c, 3 * c, b.ln1, b.qkv, p.attn_w, p.attn_b],
            ),
            d("attention_forward", samples * heads * t, &attention[..5]),
            d("attention_values", n * c, &attention),
            d(
                "dense_forward",
                n * c,
                &[n, c, c, b.y, b.proj, p.proj_w, p.proj_b],
            ),
            d("add", n * c, &[b.x, b.proj, b.mid]),
            d(
                "layer_norm_forward",
                n,
                &[c, b.mid, b.ln2, b.ln2_stats, p.ln2_g, p.ln2_b],
            ),
            d(
                "dense_forward",
                n * 4 * c,
                &[n, c, 4 * c, b.ln2, b.fc, p.fc_w, p.fc_b],
            ),
            d("gelu_tanh_forward", n * 4 * c, &[b.fc, b.gelu]),
            d(
                "dense_forward",
                n * c,
                &[n, 4 * c, c, b.gelu, b.mlp, p.mlp_w, p.mlp_b],
            ),
            d("add", n * c, &[b.mid, b.mlp, b.out]),
        ]);
    }
    out.extend([
        d(
            "layer_norm_forward",
            n,
            &[c, last, lnf, lnf_stats, lnf_g, lnf_b],
        ),
        d("gpt_head_forward", n * v, &[v, c, lnf, logits, wte]),
        d("softmax_cross_entropy", n, &[v, n, logits, logits]),
        // The head, tied to the token embedding: its share of dwte first.
        d("gpt_head_weights", v * c, &[v, c, lnf, logits, wte, n]),
        d("gpt_head_input", n * c, &[v, c, lnf, logits, wte]),
        d(
            "layer_norm_input",
            n,
            &[c, last, lnf_stats, lnf, last, 0, 0, lnf_g],
        ),
        d(
            "layer_norm_weights",
            2 * c,
            &[c, last, lnf_stats, lnf, lnf_g, lnf_b, n],
        ),
    ]);
    for (b, p) in blocks.iter().zip(&weights).rev() {
        let attention = [t, heads, c, b.qkv, b.att, b.y];
        out.extend([
            // The MLP: out = mid + gelu(fc(ln2(mid)))·W + b.
            d(
                "dense_weights",
                (4 * c + 1) * c,
                &[n, 4 * c, c, b.gelu, b.out, p.mlp_w, p.mlp_b],
            ),
            d(
                "dense_input",
                n * 4 * c,
                &[n, 4 * c, c, b.out, b.gelu, p.mlp_w],
            ),
            d("gelu_tanh_input", n * 4 * c, &[b.fc, b.gelu, b.fc, b.gelu]),
            d(
                "dense_weights",
                (c + 1) * 4 * c,
                &[n, c, 4 * c, b.ln2, b.fc, p.fc_w, p.fc_b],
            ),
            d("dense_input", n * c, &[n, c, 4 * c, b.fc, b.ln2, p.fc_w]),
            d(
                "layer_norm_input",
                n,
                &[c, b.mid, b.ln2_stats, b.ln2, b.mid, b.out, 1, p.ln2_g],
            ),
            d(
                "layer_norm_weights",
                2 * c,
                &[c, b.mid, b.ln2_stats, b.ln2, p.ln2_g, p.ln2_b, n],
            ),
            // The attention: mid = x + proj(attention(qkv(ln1(x)))).
            d(
                "dense_weights",
                (c + 1) * c,
                &[n, c, c, b.y, b.mid, p.proj_w, p.proj_b],
            ),
            d("dense_input", n * c, &[n, c, c, b.mid, b.y, p.proj_w]),
            d("attention_scores_input", samples * heads * t, &attention),
            d("attention_input", n * 3 * c, &attention),
            d(
                "dense_weights",
                (c + 1) * 3 * c,
                &[n, c, 3 * c, b.ln1, b.qkv, p.attn_w, p.attn_b],
            ),
            d("dense_input", n * c, &[n, c, 3 * c, b.qkv, b.ln1, p.attn_w]),
            d(
                "layer_norm_input",
                n,
                &[c, b.x, b.ln1_stats, b.ln1, b.x, b.mid, 1, p.ln1_g],
            ),
            d(
                "layer_norm_weights",
                2 * c,
                &[c, b.x, b.ln1_stats, b.ln1, p.ln1_g, p.ln1_b, n],
            ),
        ]);
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
        dropouts: Vec::new(),
        masks: 0,
        dispatches: out,
    })
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
        offsets.push(offset(&gpt, "wte.weight") as u32);
        let (mut a, mut b) = (written, offsets);
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b);
    }
}
