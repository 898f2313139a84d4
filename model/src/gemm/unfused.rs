//! The unfused order, computed fast: blocks of `k` packed into contiguous panels, and a
//! register tile of [`MR`] × [`NR`] values summed together. It is what the coordinator's
//! verifier replays a tab's work in, so its speed is the replay's.
//!
//! Each value's operations are still exactly [`super`]'s: its block's products summed in
//! order from zero, one rounded multiply then one rounded add each, then `alpha` and the
//! block's `beta`. Tiling only computes many values at once: the tile's sums are independent,
//! so they fill the vector lanes (Rust never fuses a multiply and an add, so whatever LLVM
//! vectorises, it rounds the same). Zero padding, where `m` or `n` is not a multiple of the
//! tile, fills rows and columns that are never written back.
//!
//! A tab itself keeps matrixmultiply's wasm kernel (the same order): measured in headless
//! Chromium, this tile was no faster there (within the machine's noise on large products,
//! half as fast on the attention's 64 × 32 × 64), so one kernel computes the tab's products
//! and this one replays them, and the wasm tests check that they agree bit for bit.

use ndarray::{s, ArrayBase, ArrayView2, ArrayViewMut2, Data, Ix2};

use super::KC;
use crate::scalar::Scalar;

/// Rows of the register tile.
const MR: usize = 4;
/// Columns of the register tile (two 128-bit vectors of `f32`).
const NR: usize = 8;
/// Columns of B packed at once: a block of `KC × NC` `f32`s is 256 KiB, inside a core's L2.
const NC: usize = 256;

/// `C ← alpha · A · B + beta · C`, in the unfused order.
pub(super) fn gemm<T, SA, SB>(
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
            pack_b(b, k0, kc, n0, nc, &mut b_panel);
            for m0 in (0..m).step_by(MR) {
                let mr = MR.min(m - m0);
                pack_a(a, m0, mr, k0, kc, &mut a_strip);
                for (strip, j0) in (n0..n0 + nc).step_by(NR).enumerate() {
                    let nr = NR.min(n0 + nc - j0);
                    let panel = &b_panel[strip * kc * NR..(strip + 1) * kc * NR];
                    let sums = tile(&a_strip, panel);
                    for (r, sums) in sums.iter().enumerate().take(mr) {
                        let sums = &sums[..nr];
                        let mut row = c.row_mut(m0 + r);
                        match row.as_slice_mut() {
                            // A row of C is a slice (in a whole matrix or an attention head's
                            // columns) but where C is a transposed view.
                            Some(row) => store.write(alpha, sums, row[j0..j0 + nr].iter_mut()),
                            None => store.write(alpha, sums, row.iter_mut().skip(j0)),
                        }
                    }
                }
            }
        }
    }
}

/// How a block's sums (times `alpha`) go into C: the first block's into `beta · C`, the others'
/// added.
#[derive(Clone, Copy)]
enum Store<T> {
    Set,
    Scaled(T),
    Add,
}

impl<T: Scalar> Store<T> {
    #[inline(always)]
    fn write<'c>(self, alpha: T, sums: &[T], c: impl Iterator<Item = &'c mut T>) {
        for (c_ij, &s) in c.zip(sums) {
            let s = s * alpha;
            *c_ij = match self {
                Self::Set => s,
                Self::Scaled(beta) => beta * *c_ij + s,
                Self::Add => *c_ij + s,
            };
        }
    }
}

/// One tile's sums over a packed block: `a` holds [`MR`] values per step of `k`, `b` [`NR`].
#[inline(always)]
fn tile<T: Scalar>(a: &[T], b: &[T]) -> [[T; NR]; MR] {
    let mut sums = [[T::zero(); NR]; MR];
    for (a, b) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
        let a: &[T; MR] = a.try_into().expect("MR values");
        let b: &[T; NR] = b.try_into().expect("NR values");
        for (row, &a_r) in sums.iter_mut().zip(a) {
            for (s, &b_j) in row.iter_mut().zip(b) {
                // A rounded multiply, then a rounded add.
                *s += a_r * b_j;
            }
        }
    }
    sums
}

/// Rows `m0..m0 + mr` of A's columns `k0..k0 + kc`, step by step: `out[p · MR + r]`.
fn pack_a<T: Scalar, S: Data<Elem = T>>(
    a: &ArrayBase<S, Ix2>,
    m0: usize,
    mr: usize,
    k0: usize,
    kc: usize,
    out: &mut Vec<T>,
) {
    out.clear();
    out.resize(kc * MR, T::zero());
    each(a.slice(s![m0..m0 + mr, k0..k0 + kc]), |r, p, x| {
        out[p * MR + r] = x;
    });
}

/// B's rows `k0..k0 + kc` and columns `n0..n0 + nc`, in strips of [`NR`] columns, each strip
/// step by step: strip `s` holds `out[s · kc · NR + p · NR + j]`.
fn pack_b<T: Scalar, S: Data<Elem = T>>(
    b: &ArrayBase<S, Ix2>,
    k0: usize,
    kc: usize,
    n0: usize,
    nc: usize,
    out: &mut Vec<T>,
) {
    out.clear();
    out.resize(nc.div_ceil(NR) * kc * NR, T::zero());
    each(b.slice(s![k0..k0 + kc, n0..n0 + nc]), |p, j, x| {
        out[(j / NR) * kc * NR + p * NR + j % NR] = x;
    });
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
