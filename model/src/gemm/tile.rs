//! The exact orders, computed fast: blocks of `k` packed into contiguous panels, and a
//! register tile of `MR` × `NR` values summed together (6 × 16 in 256-bit registers where the
//! CPU has AVX, 4 × 8 otherwise). It is what the coordinator's verifier replays a tab's work
//! in, so its speed is the replay's.
//!
//! Each value's operations are exactly [`super`]'s: its block's products summed in order from
//! zero, each product and its add one [`Madd`] (a rounded multiply then a rounded add, or the
//! two fused into one rounding), then `alpha` and the block's `beta`. Tiling only computes
//! many values at once: the tile's sums are independent, so they fill the vector lanes (Rust
//! never fuses a multiply and an add by itself, so whatever LLVM vectorises, it rounds the
//! same). Zero padding, where `m` or `n` is not a multiple of the tile, fills rows and columns
//! that are never written back.
//!
//! A tab computes its large products with this tile too (the 4 × 8 one: wasm has 128-bit
//! lanes, and wider tiles measured slower there), and its small ones with matrixmultiply's
//! wasm kernel, which computes the same order and is faster where packing would dominate
//! ([`super::gemm`]); the wasm tests check the tab against this replay bit for bit. In a wasm
//! build with relaxed SIMD the tab's tile is [`Relaxed`]'s: `f32x4.relaxed_madd`, which fuses
//! on a CPU with FMA and does not on one without, always the same way on one CPU, as
//! matrixmultiply's kernel does in such a build.

use ndarray::{s, ArrayBase, ArrayView2, ArrayViewMut2, Data, Ix2};

use super::KC;
use crate::scalar::Scalar;

/// Columns of B packed at once: a block of `KC × NC` `f32`s is 256 KiB, inside a core's L2.
const NC: usize = 256;

/// How a product and its sum are rounded: the one operation an order's values differ in.
pub(super) trait Madd: Copy {
    /// `s + a · b`.
    fn madd<T: Scalar>(a: T, b: T, s: T) -> T;

    /// One tile's sums over a packed block: `a` holds `MR` values per step of `k`, `b` `NR`.
    #[inline(always)]
    fn tile<T: Scalar, const MR: usize, const NR: usize>(a: &[T], b: &[T]) -> [[T; NR]; MR] {
        loop_tile::<Self, T, MR, NR>(a, b)
    }
}

/// [`Madd::tile`] as plain loops, which LLVM vectorises (each value's sum in its own lane).
#[inline(always)]
fn loop_tile<M: Madd, T: Scalar, const MR: usize, const NR: usize>(
    a: &[T],
    b: &[T],
) -> [[T; NR]; MR] {
    let mut sums = [[T::zero(); NR]; MR];
    for (a, b) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
        let a: &[T; MR] = a.try_into().expect("MR values");
        let b: &[T; NR] = b.try_into().expect("NR values");
        for (row, &a_r) in sums.iter_mut().zip(a) {
            for (s, &b_j) in row.iter_mut().zip(b) {
                *s = M::madd(a_r, b_j, *s);
            }
        }
    }
    sums
}

/// A rounded multiply, then a rounded add: [`super::Order::Unfused`].
#[derive(Clone, Copy)]
pub(super) struct Unfused;

impl Madd for Unfused {
    #[inline(always)]
    fn madd<T: Scalar>(a: T, b: T, s: T) -> T {
        s + a * b
    }
}

/// The multiply and the add fused, one rounding (`f32::mul_add`): [`super::Order::Fused`].
/// Natively the 256-bit tile is compiled with FMA where the CPU has it; without FMA
/// `mul_add` is computed in software, exact and slow.
#[derive(Clone, Copy)]
pub(super) struct Fused;

impl Madd for Fused {
    #[inline(always)]
    fn madd<T: Scalar>(a: T, b: T, s: T) -> T {
        a.mul_add(b, s)
    }
}

/// `f32x4.relaxed_madd`: fused on a CPU with FMA, unfused on one without, the same way for
/// every instruction on one CPU (a wasm build with relaxed SIMD; what such a tab computes,
/// [`super::Order::Library`] there). The tile is written with the instructions themselves:
/// LLVM never makes a relaxed one of plain arithmetic.
#[cfg(all(target_arch = "wasm32", target_feature = "relaxed-simd"))]
#[derive(Clone, Copy)]
pub(super) struct Relaxed;

#[cfg(all(target_arch = "wasm32", target_feature = "relaxed-simd"))]
impl Madd for Relaxed {
    #[inline(always)]
    fn madd<T: Scalar>(a: T, b: T, s: T) -> T {
        match (a.to_f32(), b.to_f32(), s.to_f32()) {
            (Some(a), Some(b), Some(s)) if std::mem::size_of::<T>() == 4 => {
                T::from_f32(relaxed_madd(a, b, s)).expect("an f32")
            }
            // f64, never a tab's: unfused.
            _ => s + a * b,
        }
    }

    #[inline(always)]
    fn tile<T: Scalar, const MR: usize, const NR: usize>(a: &[T], b: &[T]) -> [[T; NR]; MR] {
        use core::arch::wasm32::*;
        if std::mem::size_of::<T>() != 4 || MR != 4 || NR != 8 {
            // f64 (never a tab's) or another tile: the loops, one relaxed madd a value.
            return loop_tile::<Self, T, MR, NR>(a, b);
        }
        assert!(a.len() / 4 == b.len() / 8, "one tile's packed block");
        let zero = f32x4_splat(0.0);
        let mut acc = [[zero; 2]; 4];
        let (pa, pb) = (a.as_ptr().cast::<f32>(), b.as_ptr().cast::<v128>());
        for p in 0..a.len() / 4 {
            // SAFETY: `T` is `f32` (its size is 4 and `Scalar` is implemented for f32 and f64
            // only); `p` steps of 4 values of A and 8 of B are inside the slices (asserted).
            #[allow(unsafe_code)]
            let (b0, b1, a_r) = unsafe {
                (
                    v128_load(pb.add(2 * p)),
                    v128_load(pb.add(2 * p + 1)),
                    [0, 1, 2, 3].map(|r| f32x4_splat(*pa.add(4 * p + r))),
                )
            };
            for (row, a_r) in acc.iter_mut().zip(a_r) {
                row[0] = f32x4_relaxed_madd(a_r, b0, row[0]);
                row[1] = f32x4_relaxed_madd(a_r, b1, row[1]);
            }
        }
        let mut sums = [[T::zero(); NR]; MR];
        for (row, acc) in sums.iter_mut().zip(acc) {
            for (j, s) in row.iter_mut().enumerate() {
                let v = acc[j / 4];
                let lane = match j % 4 {
                    0 => f32x4_extract_lane::<0>(v),
                    1 => f32x4_extract_lane::<1>(v),
                    2 => f32x4_extract_lane::<2>(v),
                    _ => f32x4_extract_lane::<3>(v),
                };
                *s = T::from_f32(lane).expect("an f32");
            }
        }
        sums
    }
}

/// One `f32x4.relaxed_madd`'s first lane: `s + a · b`, fused or not as this CPU's relaxed
/// multiply-add is ([`super::relaxed_fuses`] asks it).
#[cfg(all(target_arch = "wasm32", target_feature = "relaxed-simd"))]
#[inline(always)]
pub(super) fn relaxed_madd(a: f32, b: f32, s: f32) -> f32 {
    use core::arch::wasm32::{f32x4_extract_lane, f32x4_relaxed_madd, f32x4_splat};
    f32x4_extract_lane::<0>(f32x4_relaxed_madd(
        f32x4_splat(a),
        f32x4_splat(b),
        f32x4_splat(s),
    ))
}

/// `C ← alpha · A · B + beta · C`, each product and its add rounded as `M` rounds them.
///
/// On an x86-64 CPU with AVX, `f32` products take a 6 × 16 tile in 256-bit registers (twelve
/// sums of eight lanes: enough independent adds to keep both of the CPU's add units busy);
/// elsewhere, and for `f64`, a 4 × 8 tile that fits baseline x86-64's sixteen 128-bit
/// registers. The lanes only decide how many values are summed at once: each value's
/// multiplies and adds are the same, so the two give the same bits (tested below). AVX is
/// enabled for the tile, and FMA for [`Fused`]'s where the CPU has it (the unfused tile
/// never: it has no fused operation to make of it).
pub(super) fn gemm<M, T, SA, SB>(
    alpha: T,
    a: &ArrayBase<SA, Ix2>,
    b: &ArrayBase<SB, Ix2>,
    beta: T,
    c: &mut ArrayViewMut2<'_, T>,
) where
    M: Madd,
    T: Scalar,
    SA: Data<Elem = T>,
    SB: Data<Elem = T>,
{
    #[cfg(target_arch = "x86_64")]
    if std::mem::size_of::<T>() == 4 {
        match wide() {
            // SAFETY: `gemm_avx_fma` needs AVX and FMA, which `wide` found on this CPU.
            #[allow(unsafe_code)]
            Wide::Fma => unsafe {
                gemm_avx_fma::<M, T, SA, SB>(alpha, a, b, beta, c);
                return;
            },
            // SAFETY: `gemm_avx` needs only AVX, which `wide` found on this CPU.
            #[allow(unsafe_code)]
            Wide::Avx => unsafe {
                gemm_avx::<M, T, SA, SB>(alpha, a, b, beta, c);
                return;
            },
            Wide::No => {}
        }
    }
    tiled::<M, T, SA, SB, 4, 8>(alpha, a, b, beta, c);
}

/// Which 256-bit tile [`gemm`] may take on this CPU.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Wide {
    /// AVX and FMA.
    Fma,
    /// AVX alone.
    Avx,
    /// Neither, or `CROWDTRAIN_NARROW_GEMM` is set (a switch for tests and benchmarks to
    /// compare the two tiles).
    No,
}

#[cfg(target_arch = "x86_64")]
fn wide() -> Wide {
    use std::sync::OnceLock;
    static WIDE: OnceLock<Wide> = OnceLock::new();
    *WIDE.get_or_init(|| {
        if !std::is_x86_feature_detected!("avx")
            || std::env::var_os("CROWDTRAIN_NARROW_GEMM").is_some()
        {
            Wide::No
        } else if std::is_x86_feature_detected!("fma") {
            Wide::Fma
        } else {
            Wide::Avx
        }
    })
}

/// [`tiled`] compiled for AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
fn gemm_avx<M, T, SA, SB>(
    alpha: T,
    a: &ArrayBase<SA, Ix2>,
    b: &ArrayBase<SB, Ix2>,
    beta: T,
    c: &mut ArrayViewMut2<'_, T>,
) where
    M: Madd,
    T: Scalar,
    SA: Data<Elem = T>,
    SB: Data<Elem = T>,
{
    tiled::<M, T, SA, SB, 6, 16>(alpha, a, b, beta, c);
}

/// [`tiled`] compiled for AVX and FMA: [`Fused`]'s `mul_add` becomes one instruction (a
/// fused multiply-add rounds exactly as `mul_add` does); [`Unfused`]'s tile is the same code
/// as [`gemm_avx`]'s, since Rust never contracts a multiply and an add.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,fma")]
fn gemm_avx_fma<M, T, SA, SB>(
    alpha: T,
    a: &ArrayBase<SA, Ix2>,
    b: &ArrayBase<SB, Ix2>,
    beta: T,
    c: &mut ArrayViewMut2<'_, T>,
) where
    M: Madd,
    T: Scalar,
    SA: Data<Elem = T>,
    SB: Data<Elem = T>,
{
    tiled::<M, T, SA, SB, 6, 16>(alpha, a, b, beta, c);
}

/// The product in register tiles of `MR` rows × `NR` columns.
#[inline(always)]
fn tiled<M, T, SA, SB, const MR: usize, const NR: usize>(
    alpha: T,
    a: &ArrayBase<SA, Ix2>,
    b: &ArrayBase<SB, Ix2>,
    beta: T,
    c: &mut ArrayViewMut2<'_, T>,
) where
    M: Madd,
    T: Scalar,
    SA: Data<Elem = T>,
    SB: Data<Elem = T>,
{
    let ((m, k), (k2, n)) = (a.dim(), b.dim());
    assert!(
        k == k2 && c.dim() == (m, n),
        "gemm shapes: {:?} · {:?} into {:?}",
        a.dim(),
        b.dim(),
        c.dim()
    );
    if k == 0 {
        c.mapv_inplace(|v| if beta.is_zero() { T::zero() } else { v * beta });
        return;
    }
    let mut b_panel = Vec::new();
    let mut a_strip = Vec::new();
    for (block, k0) in (0..k).step_by(KC).enumerate() {
        let kc = KC.min(k - k0);
        let store = match (block, beta.is_zero()) {
            (0, true) => Store::Set,
            (0, false) => Store::Scaled(beta),
            _ => Store::Add,
        };
        for n0 in (0..n).step_by(NC) {
            let nc = NC.min(n - n0);
            pack_b::<T, SB, NR>(b, k0, kc, n0, nc, &mut b_panel);
            for m0 in (0..m).step_by(MR) {
                let mr = MR.min(m - m0);
                pack_a::<T, SA, MR>(a, m0, mr, k0, kc, &mut a_strip);
                for (strip, j0) in (n0..n0 + nc).step_by(NR).enumerate() {
                    let nr = NR.min(n0 + nc - j0);
                    let panel = &b_panel[strip * kc * NR..(strip + 1) * kc * NR];
                    let sums = M::tile::<T, MR, NR>(&a_strip, panel);
                    for (r, sums) in sums.iter().enumerate().take(mr) {
                        let sums = &sums[..nr];
                        let mut row = c.row_mut(m0 + r);
                        match row.as_slice_mut() {
                            // A row of C is a slice (in a whole matrix or an attention head's
                            // columns) but where C is a transposed view.
                            Some(row) => store.write::<M>(alpha, sums, row[j0..j0 + nr].iter_mut()),
                            None => store.write::<M>(alpha, sums, row.iter_mut().skip(j0)),
                        }
                    }
                }
            }
        }
    }
}

/// How a block's sums (times `alpha`) go into C: the first block's into `beta · C` (one
/// [`Madd`], as matrixmultiply's kernel adds `beta · C`), the others' added.
#[derive(Clone, Copy)]
enum Store<T> {
    Set,
    Scaled(T),
    Add,
}

impl<T: Scalar> Store<T> {
    #[inline(always)]
    fn write<'c, M: Madd>(self, alpha: T, sums: &[T], c: impl Iterator<Item = &'c mut T>) {
        for (c_ij, &s) in c.zip(sums) {
            let s = s * alpha;
            *c_ij = match self {
                Self::Set => s,
                Self::Scaled(beta) => M::madd(beta, *c_ij, s),
                Self::Add => *c_ij + s,
            };
        }
    }
}

/// Rows `m0..m0 + mr` of A's columns `k0..k0 + kc`, step by step: `out[p · MR + r]`.
#[inline(always)]
fn pack_a<T: Scalar, S: Data<Elem = T>, const MR: usize>(
    a: &ArrayBase<S, Ix2>,
    m0: usize,
    mr: usize,
    k0: usize,
    kc: usize,
    out: &mut Vec<T>,
) {
    fit(out, kc * MR, mr < MR);
    let view = a.slice(s![m0..m0 + mr, k0..k0 + kc]);
    if view.strides()[0] == 1 {
        // A transposed (the backward's `xᵀ`): each step's `mr` values are contiguous.
        for (slot, column) in out.chunks_exact_mut(MR).zip(view.columns()) {
            let column = column
                .as_slice()
                .expect("a column of unit stride is contiguous");
            copy::<T, MR>(&mut slot[..mr], column);
        }
        return;
    }
    each(view, |r, p, x| {
        out[p * MR + r] = x;
    });
}

/// B's rows `k0..k0 + kc` and columns `n0..n0 + nc`, in strips of `NR` columns, each strip
/// step by step: strip `s` holds `out[s · kc · NR + p · NR + j]`.
#[inline(always)]
fn pack_b<T: Scalar, S: Data<Elem = T>, const NR: usize>(
    b: &ArrayBase<S, Ix2>,
    k0: usize,
    kc: usize,
    n0: usize,
    nc: usize,
    out: &mut Vec<T>,
) {
    fit(out, nc.div_ceil(NR) * kc * NR, !nc.is_multiple_of(NR));
    let view = b.slice(s![k0..k0 + kc, n0..n0 + nc]);
    if view.strides()[1] == 1 {
        // Each row of B a slice: its strips' parts copied whole.
        for (p, row) in view.rows().into_iter().enumerate() {
            let row = row.as_slice().expect("a row of unit stride is contiguous");
            for (strip, part) in row.chunks(NR).enumerate() {
                let at = strip * kc * NR + p * NR;
                copy::<T, NR>(&mut out[at..at + part.len()], part);
            }
        }
        return;
    }
    each(view, |p, j, x| {
        out[(j / NR) * kc * NR + p * NR + j % NR] = x;
    });
}

/// `out` made `len` long for a packing that writes every value of it, or, where the tile is
/// part-filled (`padded`), zeroed first: the padding's zeros must not be an earlier block's
/// values. A full tile's buffer is not zeroed again before it is overwritten.
#[inline(always)]
fn fit<T: Scalar>(out: &mut Vec<T>, len: usize, padded: bool) {
    if padded {
        out.clear();
    }
    out.resize(len, T::zero());
}

/// `dst ← src` (of one length): a whole tile's `N` values as one fixed-size copy, which the
/// compiler makes a few vector moves, where a copy of a length known only at run time is a
/// call to `memcpy` (in wasm a `memory.copy`, which Node's V8 runs out of line: 3-5 % of a tab's
/// step went to such calls, for 8 or 16 values at a time).
#[inline(always)]
fn copy<T: Copy, const N: usize>(dst: &mut [T], src: &[T]) {
    match (<&mut [T; N]>::try_from(&mut *dst), <&[T; N]>::try_from(src)) {
        (Ok(dst), Ok(src)) => *dst = *src,
        _ => {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = s;
            }
        }
    }
}

/// `f(i, j, value)` for every value of `view`, read along whichever axis is contiguous (an
/// operand is a transposed view in the backward passes).
#[inline(always)]
fn each<T: Copy>(view: ArrayView2<'_, T>, mut f: impl FnMut(usize, usize, T)) {
    if view.strides()[1] == 1 {
        for (i, row) in view.rows().into_iter().enumerate() {
            for (j, &x) in row.iter().enumerate() {
                f(i, j, x);
            }
        }
    } else {
        for (j, column) in view.columns().into_iter().enumerate() {
            for (i, &x) in column.iter().enumerate() {
                f(i, j, x);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use ndarray::Array2;

    use super::*;
    use crate::rng::SplitMix64;

    /// Both tiles, whichever this CPU's `gemm` takes, give the same bits, in either rounding:
    /// including edges where `m` or `n` leaves one tile part-filled and the other not, more
    /// than one block of `k`, and transposed operands.
    #[test]
    fn the_wide_and_narrow_tiles_give_the_same_bits() {
        fn check<M: Madd>(random: &mut impl FnMut(usize, usize) -> Array2<f32>) {
            for (m, k, n) in [
                (1, 3, 1),
                (6, 16, 16),
                (7, 300, 17),
                (12, 64, 40),
                (5, 520, 33),
            ] {
                let (a, b, c0) = (random(m, k), random(k, n), random(m, n));
                let bt = b.t().to_owned();
                for (alpha, beta) in [(1.0f32, 0.0f32), (0.3, 0.7)] {
                    let (mut narrow, mut wide) = (c0.clone(), c0.clone());
                    tiled::<M, f32, _, _, 4, 8>(alpha, &a, &bt.t(), beta, &mut narrow.view_mut());
                    tiled::<M, f32, _, _, 6, 16>(alpha, &a, &bt.t(), beta, &mut wide.view_mut());
                    let mut dispatched = c0.clone();
                    gemm::<M, _, _, _>(alpha, &a, &b, beta, &mut dispatched.view_mut());
                    let bits = |x: &Array2<f32>| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&narrow), bits(&wide), "{m}×{k}×{n}");
                    assert_eq!(bits(&narrow), bits(&dispatched), "{m}×{k}×{n}");
                }
            }
        }
        let mut rng = SplitMix64::new(3);
        let mut random = |rows: usize, cols: usize| {
            Array2::from_shape_fn((rows, cols), |_| (rng.next_f64() * 2.0 - 1.0) as f32)
        };
        check::<Unfused>(&mut random);
        check::<Fused>(&mut random);
    }
}
