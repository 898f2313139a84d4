//! The dense kernels' dispatches (`kernels.wgsl`): a tile of 4 × 4 values an invocation,
//! for a chain's dense layers and a GPT's linear layers alike.

use super::dispatch::Dispatch;

/// Values a tile spans along each side.
const TILE: usize = 4;

fn tiles(rows: usize, cols: usize) -> usize {
    rows.div_ceil(TILE) * cols.div_ceil(TILE)
}

/// `y = x·W + b` over `n` rows, `W [nin, nout]`: activations `x`, `y`; weights `w`, `b`.
pub(super) fn forward(
    n: usize,
    (nin, nout): (usize, usize),
    (x, y): (usize, usize),
    (w, b): (usize, usize),
) -> Dispatch {
    Dispatch::new("dense_forward", tiles(n, nout), &[n, nin, nout, x, y, w, b])
}

/// The gradients of `W` and `b` (at the weights' offsets `w`, `b` in the gradient), from
/// the input `x` and the output's gradient at `y`: the tiles, then a bias an invocation.
pub(super) fn weights(
    n: usize,
    (nin, nout): (usize, usize),
    (x, y): (usize, usize),
    (w, b): (usize, usize),
) -> Dispatch {
    Dispatch::new(
        "dense_weights",
        tiles(nin, nout) + nout,
        &[n, nin, nout, x, y, w, b],
    )
}

/// The input's gradient (at `x`) from the output's (at `y`).
pub(super) fn input(
    n: usize,
    (nin, nout): (usize, usize),
    (x, y): (usize, usize),
    w: usize,
) -> Dispatch {
    Dispatch::new("dense_input", tiles(n, nin), &[n, nin, nout, y, x, w])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tile covers 4 × 4 values; the edges' partial tiles count whole, and the weights'
    /// dispatch adds one invocation a bias.
    #[test]
    fn dispatches_count_tiles() {
        assert_eq!(forward(8, (3, 8), (0, 24), (0, 24)).p[0], 2 * 2);
        assert_eq!(forward(9, (3, 5), (0, 27), (0, 15)).p[0], 3 * 2);
        assert_eq!(weights(9, (7, 5), (0, 63), (0, 35)).p[0], 2 * 2 + 5);
        assert_eq!(input(1, (7, 5), (0, 7), 0).p[0], 2);
    }
}
