//! Matrix products, in a float order that can be chosen: every product the layers take goes
//! through [`gemm`].
//!
//! By default it is ndarray's, that is matrixmultiply's kernels, which fuse each multiply
//! and add (FMA) where the CPU has it (x86 with AVX2 and FMA, aarch64). A browser tab's wasm
//! (128-bit SIMD, no FMA), and a native worker on a CPU without FMA, compute the same sums
//! unfused. Over one gradient the two differ by rounding, which verification allows; over a
//! local phase of tens of steps a near-tie taken one way by the tab and the other by the
//! coordinator moves every later step, and an honest tab's phase can end percents away from
//! the coordinator's replay (`bench --bin ties --steps 45`: 2.2 % of the norm on one phase
//! in eight of the `cnn` preset from its initial weights).
//!
//! [`Order::Unfused`] computes exactly what those unfused kernels compute, so the
//! coordinator can replay a tab's work bit for bit: matrixmultiply splits `k` into blocks of
//! [`KC`]; each output value sums a block's products in order from zero, one rounded
//! multiply then one rounded add each, scales the sum by `alpha`, and adds it to `beta · C`
//! for the first block and to `C` for the others. Vectorised or not, each value's operations
//! are these, in this order (the test below checks it against a naive loop, and against
//! matrixmultiply itself, which on this machine fuses, within rounding; `scripts/test.sh`
//! checks it against wasm bit for bit). `unfused` computes it in packed register tiles.
//!
//! In wasm, [`Order::Library`] takes that tile for large products and matrixmultiply's kernel
//! for small ones ([`tab_takes_tile`]): there the two are one order, so a tab computes each
//! product in the faster.
//!
//! [`Order::Fused`] is the same order with each multiply and its add fused (one rounding),
//! `beta · C` added the same way: what a tab computes in a wasm build with relaxed SIMD on a
//! CPU whose `f32x4.relaxed_madd` fuses ([`relaxed_fuses`]), matrixmultiply's kernel and the
//! tile alike. On a CPU whose relaxed multiply-add does not fuse, such a tab computes
//! [`Order::Unfused`].
//!
//! The order is a per-thread setting, [`with_order`], rather than a parameter of every
//! forward and backward pass: only the coordinator's verifier changes it, around one replay.

mod tile;

use std::cell::Cell;

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayBase, ArrayViewMut2, Data, Ix2};

use crate::scalar::Scalar;

/// Which float order [`gemm`] computes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// matrixmultiply's kernel for this CPU (fused where it has FMA); in wasm, which has no
    /// FMA, the unfused tile for large products ([`tab_takes_tile`]), the same order.
    #[default]
    Library,
    /// Multiply, then add, in matrixmultiply's order: what wasm computes.
    Unfused,
    /// The same order with each multiply and add fused, `f32::mul_add`: what a tab computes
    /// whose relaxed SIMD fuses ([`relaxed_fuses`]).
    Fused,
}

/// matrixmultiply's `kc` for `f32` (its `S_KC`): the block of `k` summed from zero.
pub const KC: usize = 256;

thread_local! {
    static ORDER: Cell<Order> = const { Cell::new(Order::Library) };
}

/// Runs `f` with every product on this thread in `order`, then restores the previous order
/// (also when `f` panics).
pub fn with_order<R>(order: Order, f: impl FnOnce() -> R) -> R {
    struct Restore(Order);
    impl Drop for Restore {
        fn drop(&mut self) {
            ORDER.set(self.0);
        }
    }
    let _restore = Restore(ORDER.replace(order));
    f()
}

/// The order [`gemm`] computes in on this thread now.
pub fn order() -> Order {
    ORDER.get()
}

/// `C ← alpha · A · B + beta · C`, in this thread's [`Order`].
pub fn gemm<T, SA, SB>(
    alpha: T,
    a: &ArrayBase<SA, Ix2>,
    b: &ArrayBase<SB, Ix2>,
    beta: T,
    c: &mut ArrayViewMut2<'_, T>,
) where
    T: Scalar,
    SA: Data<Elem = T>,
    SB: Data<Elem = T>,
{
    match order() {
        Order::Library if !tab_takes_tile(a.nrows(), a.ncols(), b.ncols()) => {
            general_mat_mul(alpha, a, b, beta, c)
        }
        Order::Library => tile::gemm::<TabMadd, _, _, _>(alpha, a, b, beta, c),
        Order::Unfused => tile::gemm::<tile::Unfused, _, _, _>(alpha, a, b, beta, c),
        Order::Fused => tile::gemm::<tile::Fused, _, _, _>(alpha, a, b, beta, c),
    }
}

/// How a tab's own tile rounds: as matrixmultiply's wasm kernel does in the same build.
#[cfg(not(all(target_arch = "wasm32", target_feature = "relaxed-simd")))]
type TabMadd = tile::Unfused;
#[cfg(all(target_arch = "wasm32", target_feature = "relaxed-simd"))]
type TabMadd = tile::Relaxed;

/// Whether this build's [`Order::Library`] fuses its products' multiplies and adds the way
/// [`Order::Fused`] does: in a wasm build with relaxed SIMD, whether this CPU's
/// `f32x4.relaxed_madd` fuses, found once by a product whose two roundings differ; in any
/// other build, `false` (natively matrixmultiply may fuse, in an order of its own). A tab
/// says it in its `Hello`, so that the coordinator replays it in the order it computed.
pub fn relaxed_fuses() -> bool {
    #[cfg(all(target_arch = "wasm32", target_feature = "relaxed-simd"))]
    {
        use std::sync::OnceLock;
        static FUSES: OnceLock<bool> = OnceLock::new();
        *FUSES.get_or_init(|| {
            // (1 + 2⁻¹²)² = 1 + 2⁻¹¹ + 2⁻²⁴: rounded to f32 before the add, the 2⁻²⁴ is lost
            // and the sum with −(1 + 2⁻¹¹) is 0; fused, it is 2⁻²⁴.
            let x = std::hint::black_box(1.0f32 + f32::powi(2.0, -12));
            let minus = std::hint::black_box(-(1.0f32 + f32::powi(2.0, -11)));
            tile::relaxed_madd(x, x, minus) != 0.0
        })
    }
    #[cfg(not(all(target_arch = "wasm32", target_feature = "relaxed-simd")))]
    false
}

/// Whether a tab's product of `m × k` by `k × n` takes the unfused order's tile rather than
/// matrixmultiply's kernel. In wasm the two compute the same order (the library's kernel has
/// no FMA there), so the faster may be taken shape by shape: measured in headless Chromium
/// (BENCHMARKS.md, "A tab's products"), the 4 × 8 tile computes the GPT's large products
/// 1.3-1.7 times as fast as matrixmultiply's 8 × 8 (whose sixteen accumulators outnumber the
/// registers V8 gives it), and small ones (an attention head's 64 × 32 × 64, a batch of 32
/// rows) up to a fifth slower: its packing is paid per product. Natively, never.
///
/// In a build with relaxed SIMD (`-C target-feature=+relaxed-simd`) both take
/// `f32x4.relaxed_madd`, so they still compute one order: fused on a CPU whose relaxed
/// multiply-add fuses, unfused on one whose does not.
pub fn tab_takes_tile(m: usize, k: usize, n: usize) -> bool {
    cfg!(target_arch = "wasm32") && m >= 128 && k >= 64 && n >= 64
}

#[cfg(test)]
mod tests {
    use ndarray::Array2;

    use super::*;
    use crate::rng::SplitMix64;

    fn random(rng: &mut SplitMix64, rows: usize, cols: usize) -> Array2<f32> {
        Array2::from_shape_fn((rows, cols), |_| (rng.next_f64() * 2.0 - 1.0) as f32)
    }

    /// The naive reference: each value's products summed in order from zero, block by block
    /// of [`KC`], each product and its add rounded by `madd`, `beta · C` added by it too.
    fn reference(
        madd: fn(f32, f32, f32) -> f32,
        alpha: f32,
        a: &Array2<f32>,
        b: &Array2<f32>,
        beta: f32,
        c: &Array2<f32>,
    ) -> Array2<f32> {
        let (m, k, n) = (a.nrows(), a.ncols(), b.ncols());
        let mut out = c.clone();
        for i in 0..m {
            for j in 0..n {
                let mut value = c[[i, j]];
                for (block, start) in (0..k).step_by(KC).enumerate() {
                    let mut s = 0.0f32;
                    for p in start..(start + KC).min(k) {
                        s = madd(a[[i, p]], b[[p, j]], s);
                    }
                    s *= alpha;
                    value = if block == 0 && beta == 0.0 {
                        s
                    } else if block == 0 {
                        madd(beta, value, s)
                    } else {
                        value + s
                    };
                }
                out[[i, j]] = value;
            }
        }
        out
    }

    #[test]
    fn unfused_products_equal_the_naive_order_bit_for_bit() {
        exact_products_equal_the_naive_order(Order::Unfused, |a, b, s| s + a * b);
    }

    #[test]
    fn fused_products_equal_the_naive_fused_order_bit_for_bit() {
        exact_products_equal_the_naive_order(Order::Fused, f32::mul_add);
    }

    /// Fused and unfused differ (they are two orders, and the coordinator must tell which a
    /// tab computed in), by rounding only.
    #[test]
    fn the_fused_and_unfused_orders_differ_by_rounding() {
        let mut rng = SplitMix64::new(5);
        let (a, b) = (random(&mut rng, 64, 300), random(&mut rng, 300, 48));
        let product = |order| {
            let mut c = Array2::zeros((64, 48));
            with_order(order, || gemm(1.0, &a, &b, 0.0, &mut c.view_mut()));
            c
        };
        let (fused, unfused) = (product(Order::Fused), product(Order::Unfused));
        let differ = fused.iter().zip(&unfused).filter(|(x, y)| x != y).count();
        assert!(differ > fused.len() / 4, "only {differ} values differ");
        for (x, y) in fused.iter().zip(&unfused) {
            assert!((x - y).abs() <= 1e-4, "{x} vs {y}");
        }
    }

    fn exact_products_equal_the_naive_order(order: Order, madd: fn(f32, f32, f32) -> f32) {
        let mut rng = SplitMix64::new(7);
        for (m, k, n) in [
            (1, 1, 1),
            (3, 5, 7),
            (32, 300, 10),
            (9, 600, 17),
            (16, 25, 33),
            // More than one block of columns, and three of `k` (the last part-filled).
            (6, 530, 300),
            (13, 70, 9),
        ] {
            let a = random(&mut rng, m, k);
            let b = random(&mut rng, k, n);
            let c0 = random(&mut rng, m, n);
            for (alpha, beta) in [(1.0f32, 0.0f32), (1.0, 1.0), (0.3, 0.0), (0.3, 0.7)] {
                let mut c = c0.clone();
                with_order(order, || gemm(alpha, &a, &b, beta, &mut c.view_mut()));
                let want = reference(madd, alpha, &a, &b, beta, &c0);
                assert!(
                    c.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{order:?} {m}×{k}×{n}, alpha {alpha}, beta {beta}"
                );
                // Transposed operands (the backward passes' views) give the same values.
                let (at, bt) = (a.t().to_owned(), b.t().to_owned());
                let mut c_t = c0.clone();
                with_order(order, || {
                    gemm(alpha, &at.t(), &bt.t(), beta, &mut c_t.view_mut())
                });
                assert_eq!(c_t, c);
                // So does a C that is some columns of a wider array, and a transposed C.
                let mut wide = Array2::zeros((m, n + 3));
                wide.slice_mut(ndarray::s![.., 1..n + 1]).assign(&c0);
                let mut c_t = c0.t().to_owned();
                with_order(order, || {
                    gemm(
                        alpha,
                        &a,
                        &b,
                        beta,
                        &mut wide.slice_mut(ndarray::s![.., 1..n + 1]),
                    );
                    gemm(alpha, &a, &b, beta, &mut c_t.view_mut().reversed_axes());
                });
                assert_eq!(wide.slice(ndarray::s![.., 1..n + 1]), c);
                assert_eq!(c_t.t(), c);
            }
        }
    }

    #[test]
    fn the_order_is_restored_after_the_closure() {
        assert_eq!(order(), Order::Library);
        with_order(Order::Unfused, || {
            assert_eq!(order(), Order::Unfused);
            with_order(Order::Library, || assert_eq!(order(), Order::Library));
            assert_eq!(order(), Order::Unfused);
        });
        assert_eq!(order(), Order::Library);
    }

    /// Within rounding of matrixmultiply (which fuses on a CPU with FMA, so only close).
    #[test]
    fn unfused_products_are_within_rounding_of_the_library() {
        let mut rng = SplitMix64::new(11);
        let (a, b) = (random(&mut rng, 20, 700), random(&mut rng, 700, 30));
        let mut lib = Array2::zeros((20, 30));
        let mut ours = Array2::zeros((20, 30));
        gemm(1.0, &a, &b, 0.0, &mut lib.view_mut());
        with_order(Order::Unfused, || {
            gemm(1.0, &a, &b, 0.0, &mut ours.view_mut())
        });
        for (x, y) in lib.iter().zip(&ours) {
            assert!((x - y).abs() <= 1e-4, "{x} vs {y}");
        }
    }
}
