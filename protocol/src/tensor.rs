//! Tensors on the wire: raw little-endian `f32`, or compressed to `f16` or to `int8` with one
//! `f32` scale per chunk of [`INT8_CHUNK`] values. A worker asks for a compression in
//! `Hello`; `Welcome` confirms it; its `Weights` and `Gradient`s then use it. The codec is
//! the same on both sides, so what is lost is exactly the rounding documented here.

use half::slice::HalfFloatSliceExt;

/// f16 values converted at a time, on the stack (a multiple of the 8 F16C converts at once).
const F16_BLOCK: usize = 256;

/// Values per int8 chunk: each chunk has its own scale, so one large value only coarsens its
/// own chunk.
pub const INT8_CHUNK: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// 4 bytes per value, exact.
    #[default]
    None,
    /// IEEE 754 half precision, 2 bytes per value (relative error ≤ 2^-11, range ±65504).
    F16,
    /// `round(x / scale)` in -127..=127 with `scale = max|x| / 127` per chunk: about 1 byte
    /// per value (plus 4 per 256), error ≤ scale / 2.
    Int8,
}

impl Compression {
    pub fn to_u8(self) -> u8 {
        match self {
            Self::None => 0,
            Self::F16 => 1,
            Self::Int8 => 2,
        }
    }

    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::None),
            1 => Some(Self::F16),
            2 => Some(Self::Int8),
            _ => None,
        }
    }

    /// Payload bytes for `count` values.
    pub fn payload_len(self, count: usize) -> Option<usize> {
        match self {
            Self::None => count.checked_mul(4),
            Self::F16 => count.checked_mul(2),
            Self::Int8 => count
                .div_ceil(INT8_CHUNK)
                .checked_mul(4)?
                .checked_add(count),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::F16 => "f16",
            Self::Int8 => "int8",
        }
    }
}

/// Appends `values` encoded with `c` (payload only; the caller writes tag and count).
pub fn encode_payload(out: &mut Vec<u8>, values: &[f32], c: Compression) {
    let start = out.len();
    match c {
        Compression::None => {
            out.resize(start + values.len() * 4, 0);
            for (o, x) in out[start..].chunks_exact_mut(4).zip(values) {
                o.copy_from_slice(&x.to_le_bytes());
            }
        }
        Compression::F16 => {
            // Converted 8 at a time (F16C where the CPU has it, found at run time; the same
            // round-to-nearest-even bits as the portable path the wasm worker takes).
            // A block at a time on the stack: nothing allocated per chunk.
            out.reserve(values.len() * 2);
            let mut halves = [half::f16::ZERO; F16_BLOCK];
            for block in values.chunks(F16_BLOCK) {
                let halves = &mut halves[..block.len()];
                halves.convert_from_f32_slice(block);
                for h in halves.iter() {
                    out.extend_from_slice(&h.to_le_bytes());
                }
            }
        }
        Compression::Int8 => {
            out.reserve(c.payload_len(values.len()).unwrap_or(0));
            for chunk in values.chunks(INT8_CHUNK) {
                // NaN or infinity make the scale non-finite, which decoding turns back into
                // non-finite values: the receiver's validation still sees them.
                let max = chunk.iter().fold(0.0f32, |m, x| {
                    if x.abs() > m || x.is_nan() {
                        x.abs()
                    } else {
                        m
                    }
                });
                let scale = max / 127.0;
                out.extend_from_slice(&scale.to_le_bytes());
                let inv = if scale > 0.0 && scale.is_finite() {
                    1.0 / scale
                } else {
                    0.0
                };
                out.extend(
                    chunk
                        .iter()
                        .map(|x| (x * inv).round().clamp(-127.0, 127.0) as i8 as u8),
                );
            }
        }
    }
}

/// Decodes a payload of `count` values; `raw` must be exactly `c.payload_len(count)` bytes.
pub fn decode_payload(raw: &[u8], count: usize, c: Compression) -> Vec<f32> {
    let mut out = Vec::with_capacity(count);
    decode_payload_append(raw, count, &mut out, c);
    out
}

/// Decodes a payload of `count` values onto the end of `out`, in one pass with no
/// intermediate buffer; `raw` must be exactly `c.payload_len(count)` bytes.
pub fn decode_payload_append(raw: &[u8], count: usize, out: &mut Vec<f32>, c: Compression) {
    out.reserve(count);
    match c {
        Compression::None => out.extend(
            raw.chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
        Compression::F16 => {
            let mut halves = [half::f16::ZERO; F16_BLOCK];
            let mut floats = [0.0f32; F16_BLOCK];
            for block in raw.chunks(2 * F16_BLOCK) {
                let n = block.len() / 2;
                for (h, b) in halves.iter_mut().zip(block.chunks_exact(2)) {
                    *h = half::f16::from_le_bytes([b[0], b[1]]);
                }
                halves[..n].convert_to_f32_slice(&mut floats[..n]);
                out.extend_from_slice(&floats[..n]);
            }
        }
        Compression::Int8 => {
            for block in raw.chunks(INT8_CHUNK + 4) {
                let scale = f32::from_le_bytes([block[0], block[1], block[2], block[3]]);
                out.extend(block[4..].iter().map(|&q| f32::from(q as i8) * scale));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectorised f16 conversion (F16C on this CPU) gives exactly the bits of the
    /// portable software conversion, which the wasm worker uses: verification recomputes on
    /// what the worker decoded, so the two must agree to the bit. Every f16 bit pattern one
    /// way; the other way, 2^16 f32 spread over the whole range, with ties, subnormals and
    /// values that overflow.
    #[test]
    fn f16_slices_match_the_portable_conversion_bit_for_bit() {
        let halves: Vec<u8> = (0..=u16::MAX)
            .filter(|&b| !half::f16::from_bits(b).is_nan())
            .flat_map(u16::to_le_bytes)
            .collect();
        let mut got = Vec::new();
        decode_payload_append(&halves, halves.len() / 2, &mut got, Compression::F16);
        for (b, g) in halves.chunks_exact(2).zip(&got) {
            let h = half::f16::from_le_bytes([b[0], b[1]]);
            assert_eq!(g.to_bits(), h.to_f32_const().to_bits(), "{h}");
        }
        let mut values: Vec<f32> = (0..=u16::MAX)
            .map(|i| f32::from_bits(u32::from(i).wrapping_mul(65_537) ^ 0x0040_0000))
            .filter(|v| v.is_finite())
            .collect();
        // Halfway between two f16 values: ties go to even.
        values.extend([
            1.0 + 1.0 / 2048.0,
            1.0 + 3.0 / 2048.0,
            65_520.0,
            6.0e-8,
            3.0e-8,
        ]);
        let mut raw = Vec::new();
        encode_payload(&mut raw, &values, Compression::F16);
        for (v, b) in values.iter().zip(raw.chunks_exact(2)) {
            let want = half::f16::from_f32_const(*v).to_bits();
            assert_eq!(u16::from_le_bytes([b[0], b[1]]), want, "{v}");
        }
    }

    fn round_trip(values: &[f32], c: Compression) -> Vec<f32> {
        let mut out = Vec::new();
        encode_payload(&mut out, values, c);
        assert_eq!(Some(out.len()), c.payload_len(values.len()));
        decode_payload(&out, values.len(), c)
    }

    #[test]
    fn none_is_exact_f16_and_int8_are_within_their_bounds() {
        let values: Vec<f32> = (0..1000)
            .map(|i| ((i * 37 % 200) as f32 - 100.0) * 0.013)
            .collect();
        assert_eq!(round_trip(&values, Compression::None), values);
        for (a, b) in values.iter().zip(round_trip(&values, Compression::F16)) {
            assert!((a - b).abs() <= a.abs() / 2048.0 + 1e-7, "{a} vs {b}");
        }
        let got = round_trip(&values, Compression::Int8);
        for (chunk, back) in values.chunks(INT8_CHUNK).zip(got.chunks(INT8_CHUNK)) {
            let scale = chunk.iter().fold(0.0f32, |m, x| m.max(x.abs())) / 127.0;
            for (a, b) in chunk.iter().zip(back) {
                assert!(
                    (a - b).abs() <= scale / 2.0 + 1e-6,
                    "{a} vs {b} (scale {scale})"
                );
            }
        }
    }

    #[test]
    fn int8_sizes_zeros_partial_chunks_and_non_finite() {
        assert_eq!(Compression::Int8.payload_len(0), Some(0));
        assert_eq!(Compression::Int8.payload_len(257), Some(2 * 4 + 257));
        assert_eq!(round_trip(&[0.0; 300], Compression::Int8), vec![0.0; 300]);
        assert_eq!(round_trip(&[1.0, -2.0, 0.5], Compression::Int8)[1], -2.0);
        let back = round_trip(&[1.0, f32::NAN, 2.0], Compression::Int8);
        assert!(
            back.iter().any(|v| !v.is_finite()),
            "NaN must stay detectable: {back:?}"
        );
        let back = round_trip(&[f32::INFINITY, 2.0], Compression::Int8);
        assert!(
            back.iter().any(|v| !v.is_finite()),
            "inf must stay detectable: {back:?}"
        );
        assert!(round_trip(&[f32::NAN], Compression::F16)[0].is_nan());
        assert_eq!(Compression::from_u8(3), None);
    }
}
