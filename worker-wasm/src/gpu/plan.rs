//! What the GPU runs for a batch of `n` rows: where each activation lives, and the
//! kernels (`kernels.wgsl`) in order with their parameters. Built from the network alone,
//! so it is the same on every tab and checked natively.

use model::{Layer, Network, Stage};

use super::dense;
use super::dispatch::{Dispatch, Plan, TooLarge};

impl Plan {
    /// The plan for `net` and batches of `rows` samples.
    pub fn new(net: &Network, rows: usize) -> Result<Self, TooLarge> {
        if let Some(gpt) = net.as_gpt() {
            return super::gpt_plan::plan(gpt, rows);
        }
        let stages = net.stages();
        // Where each layer's input lives (the last entry: the logits); a flatten's output
        // is its input.
        let mut at = vec![0usize];
        let mut end = rows * net.inputs();
        for s in &stages {
            let here = *at.last().expect("the input");
            if let Layer::Flatten = s.layer {
                at.push(here);
            } else {
                at.push(end);
                end += rows * s.output.len();
            }
        }
        let (mut dispatches, mut dropouts, mut masks) = (Vec::new(), Vec::new(), 0);
        let mut mask_at = Vec::with_capacity(stages.len());
        for (i, s) in stages.iter().enumerate() {
            mask_at.push(masks);
            if let Layer::Dropout { .. } = s.layer {
                dropouts.push(i);
                masks += rows * s.output.len();
            }
            dispatches.extend(forward(s, rows, at[i], at[i + 1], mask_at[i]));
        }
        let logits = *at.last().expect("the logits");
        dispatches.push(Dispatch::new(
            "softmax_cross_entropy",
            rows,
            &[net.classes(), rows, logits, logits],
        ));
        for (i, s) in stages.iter().enumerate().rev() {
            dispatches.extend(backward(s, rows, at[i], at[i + 1], mask_at[i], i > 0));
        }
        let largest = end.max(net.param_count()).max(masks);
        if largest > u32::MAX as usize / 2 {
            return Err(TooLarge::Values(largest));
        }
        Ok(Self {
            rows,
            labels: rows,
            params: net.param_count(),
            acts: end,
            outputs: at[1..].to_vec(),
            dropouts,
            masks,
            dispatches,
        })
    }
}

/// The parameters of a convolution's three kernels (`conv_*` in `kernels.wgsl`), reading
/// `x` and writing `y` (or their gradients).
fn conv(
    s: &Stage,
    rows: usize,
    (kernel, stride, padding): (usize, usize, usize),
    x: usize,
    y: usize,
) -> Vec<usize> {
    let (i, o, (weight, bias)) = (s.input, s.output, s.weight_and_bias());
    vec![
        rows,
        i.c,
        i.h,
        i.w,
        o.c,
        o.h,
        o.w,
        kernel,
        stride,
        padding,
        x,
        y,
        weight.start,
        bias.start,
    ]
}

/// A pool's kernels (`*_pool_*`), forward or backward, and their parameters.
fn pool(s: &Stage, rows: usize, x: usize, y: usize, backward: bool) -> (&'static str, [usize; 12]) {
    let (i, o) = (s.input, s.output);
    let (kernel, size, stride) = match (s.layer, backward) {
        (Layer::MaxPool { size, stride }, false) => ("max_pool_forward", size, stride),
        (Layer::MaxPool { size, stride }, true) => ("max_pool_input", size, stride),
        (Layer::AvgPool { size, stride }, false) => ("avg_pool_forward", size, stride),
        (Layer::AvgPool { size, stride }, true) => ("avg_pool_input", size, stride),
        _ => unreachable!("a pool"),
    };
    (
        kernel,
        [rows, i.c, i.h, i.w, o.h, o.w, size, stride, x, y, x, y],
    )
}

fn forward(s: &Stage, rows: usize, x: usize, y: usize, mask: usize) -> Vec<Dispatch> {
    let values = rows * s.output.len();
    let (weight, bias) = s.weight_and_bias();
    let one = |kernel| vec![Dispatch::new(kernel, values, &[x, y, x, y, mask])];
    match s.layer {
        Layer::Dense { units } => vec![dense::forward(
            rows,
            (s.input.len(), units),
            (x, y),
            (weight.start, bias.start),
        )],
        Layer::Conv2d {
            kernel,
            stride,
            padding,
            ..
        } => {
            let p = conv(s, rows, (kernel, stride, padding), x, y);
            vec![Dispatch::new("conv_forward", values, &p)]
        }
        Layer::MaxPool { .. } | Layer::AvgPool { .. } => {
            let (kernel, p) = pool(s, rows, x, y, false);
            vec![Dispatch::new(kernel, values, &p)]
        }
        Layer::Flatten => Vec::new(),
        Layer::Relu => one("relu_forward"),
        Layer::Tanh => one("tanh_forward"),
        Layer::Gelu => one("gelu_forward"),
        Layer::Dropout { .. } => one("dropout_forward"),
    }
}

/// The gradient of a layer's parameters (if trained) and of its input (if `need_dx`); the
/// gradients of activations live where the activations do.
fn backward(
    s: &Stage,
    rows: usize,
    x: usize,
    y: usize,
    mask: usize,
    need_dx: bool,
) -> Vec<Dispatch> {
    let inputs = rows * s.input.len();
    let (weight, bias) = s.weight_and_bias();
    let mut out = Vec::new();
    let one = |kernel| Dispatch::new(kernel, inputs, &[x, y, x, y, mask]);
    match s.layer {
        Layer::Dense { units } => {
            let shape = (s.input.len(), units);
            if s.trained {
                out.push(dense::weights(
                    rows,
                    shape,
                    (x, y),
                    (weight.start, bias.start),
                ));
            }
            if need_dx {
                out.push(dense::input(rows, shape, (x, y), weight.start));
            }
        }
        Layer::Conv2d {
            kernel,
            stride,
            padding,
            filters,
        } => {
            let p = conv(s, rows, (kernel, stride, padding), x, y);
            if s.trained {
                let values = filters * s.input.c * kernel * kernel + filters;
                out.push(Dispatch::new("conv_weights", values, &p));
            }
            if need_dx {
                out.push(Dispatch::new("conv_input", inputs, &p));
            }
        }
        _ if !need_dx => {}
        Layer::MaxPool { .. } | Layer::AvgPool { .. } => {
            let (kernel, p) = pool(s, rows, x, y, true);
            out.push(Dispatch::new(kernel, inputs, &p));
        }
        Layer::Flatten => {}
        Layer::Relu => out.push(one("relu_input")),
        Layer::Tanh => out.push(one("tanh_input")),
        Layer::Gelu => out.push(one("gelu_input")),
        Layer::Dropout { .. } => out.push(one("dropout_input")),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(spec: &str) -> Network {
        let spec: model::NetSpec = spec.parse().expect("a spec");
        let classes = spec.outputs().expect("classes");
        Network::new(spec, classes).expect("builds")
    }

    /// Every layer's activations laid out one after the other (a flatten sharing its
    /// input's), a kernel per layer forward and per gradient backward, in order.
    #[test]
    fn a_plan_lays_out_every_activation_and_kernel() {
        let cnn = net(
            "input 1x6x6; conv2d 2 k3 s1 p1; relu; maxpool 2 s2; flatten; dropout 0.5; dense 3",
        );
        let plan = Plan::new(&cnn, 4).expect("plans");
        // input 4·36, conv 4·72, relu 4·72, pool 4·18, dropout 4·18, logits 4·3
        assert_eq!(plan.acts, 4 * (36 + 72 + 72 + 18 + 18 + 3));
        assert_eq!((plan.dropouts.clone(), plan.masks), (vec![4], 4 * 18));
        let kernels: Vec<_> = plan.dispatches.iter().map(|d| d.kernel).collect();
        assert_eq!(
            kernels,
            [
                "conv_forward",
                "relu_forward",
                "max_pool_forward",
                "dropout_forward",
                "dense_forward",
                "softmax_cross_entropy",
                "dense_weights",
                "dense_input",
                "dropout_input",
                "max_pool_input",
                "relu_input",
                "conv_weights",
            ]
        );
        // The dense layer reads the dropout's output, which follows the pool's: its 4 × 3
        // values one tile.
        let dense = &plan.dispatches[4];
        assert_eq!(dense.p[..5], [1, 4, 18, 3, 4 * (36 + 72 + 72 + 18)]);
        assert_eq!(dense.groups(), (1, 1));
        let wide = Dispatch::new("relu_forward", 64 * 65_535 * 2 + 1, &[]);
        assert_eq!(wide.groups(), (65_535, 3));
    }

    /// A frozen layer gets no gradient kernel (its gradient stays zero).
    #[test]
    fn a_frozen_layer_computes_no_weight_gradient() {
        let mlp = net("input 4; dense 5 frozen; relu; dense 3");
        let kernels: Vec<_> = Plan::new(&mlp, 2)
            .expect("plans")
            .dispatches
            .iter()
            .map(|d| d.kernel)
            .collect();
        assert_eq!(kernels.iter().filter(|k| **k == "dense_weights").count(), 1);
    }
}
