//! `e^x` for `f32` in plain arithmetic: Cephes' `expf` (Cody-Waite reduction by `ln 2`, a
//! degree-6 polynomial, then `2^n` put in the exponent's bits), branch-free so that a loop of
//! it vectorises (SSE/AVX natively, 128-bit SIMD in wasm).
//!
//! Every step is one IEEE operation (a multiply, an add, a comparison, a conversion, integer
//! bits), never fused, so wasm and every native CPU compute the same bits, which is what the
//! coordinator's replay of a tab needs: the reason `libm`'s `expf` was used before, whose
//! table lookups and branches kept every call scalar. Within 2 ulp of `e^x` (1 at worst
//! over the test's half a million points against `f64`'s), as `libm`'s is within 1.
//! Overflows to infinity above 88.72, is subnormal below -87.34 and 0 below about -103.97;
//! NaN stays NaN.

/// `1.5 · 2^23`: added and taken away, it rounds a float of magnitude below `2^22` to the
/// nearest integer (ties to even) in two adds, which vectorise where a rounding call may not.
const ROUND: f32 = 12_582_912.0;
const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` in two parts: the first with 9 significant bits, so `n · LN2_HI` is exact.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;

/// `e^x`.
#[inline(always)]
pub(crate) fn expf(x: f32) -> f32 {
    // Beyond these every result is infinity or 0 (a NaN passes: `clamp` keeps it).
    let x = x.clamp(-104.0, 89.0);
    let n = (x * LOG2_E + ROUND) - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.987_569_2e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let y = p * (r * r) + r + 1.0;
    // `2^n` in two factors, each a normal float for `n` in -150..=128: the first product is
    // exact, the second rounds once (into the subnormals, or to infinity).
    let n = n as i32;
    let half = n >> 1;
    y * pow2(half) * pow2(n - half)
}

/// `2^n` for `n` in -126..=127.
#[inline(always)]
fn pow2(n: i32) -> f32 {
    f32::from_bits(((n + 127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The distance in representable floats (of one sign) between `a` and `b`.
    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn within_two_ulp_of_the_exact_exponential_across_its_range() {
        let mut worst = (0, 0.0f32);
        let mut x = -103.0f32;
        while x < 88.7 {
            let want = (x as f64).exp() as f32;
            let got = expf(x);
            // Subnormal results hold fewer bits: compare them absolutely.
            let off = if want < f32::MIN_POSITIVE {
                u32::from((got - want).abs() > f32::from_bits(2))
            } else {
                ulps(got, want)
            };
            if off > worst.0 {
                worst = (off, x);
            }
            x += 0.000_37;
        }
        assert!(worst.0 <= 2, "{} ulp at {}", worst.0, worst.1);
    }

    #[test]
    fn the_ends_and_the_special_values() {
        assert_eq!(expf(0.0), 1.0);
        assert_eq!(expf(-0.0), 1.0);
        assert_eq!(expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(expf(-104.0), 0.0);
        assert_eq!(expf(f32::INFINITY), f32::INFINITY);
        assert_eq!(expf(89.0), f32::INFINITY);
        assert!(expf(88.7).is_finite());
        assert!(expf(f32::NAN).is_nan());
        assert!(expf(-100.0) > 0.0 && expf(-100.0) < f32::MIN_POSITIVE);
        assert_eq!(expf(1.0), std::f32::consts::E);
    }
}
