//! Tensors on the wire: raw little-endian `f32`, or compressed to `f16`, to `int8` with one
//! `f32` scale per chunk of [`INT8_CHUNK`] values, to `int4` with one per [`INT4_CHUNK`], or
//! to `int2` (three levels) with one per [`INT2_CHUNK`], packed by its zeros: the only
//! encoding whose length depends on the values ([`Compression::is_sized`], [`int2_len`]).
//! A worker asks for a compression in `Hello`; `Welcome` confirms it; its `Weights` and
//! `Gradient`s then use it (`int4`'s and `int2`'s weights go as `int8`:
//! [`Compression::for_weights`]). The
//! codec is the same on both sides, so what is lost is exactly the rounding documented here.

use half::slice::HalfFloatSliceExt;

/// f16 values converted at a time, on the stack (a multiple of the 8 F16C converts at once).
const F16_BLOCK: usize = 256;

/// Values per int8 chunk: each chunk has its own scale, so one large value only coarsens its
/// own chunk.
pub const INT8_CHUNK: usize = 256;

/// Values per int4 chunk: a finer grain than int8's, since a chunk's largest value sets a step
/// of a seventh of it. 36 bytes a chunk, 0.5625 a value.
pub const INT4_CHUNK: usize = 64;

/// Values per int2 chunk: 10 bytes a chunk and a bit for each of its nonzero values, 18 at
/// most (0.16-0.28 bytes a value).
pub const INT2_CHUNK: usize = 64;

/// Bytes of an int2 chunk's scale: a bfloat16 (protocol 15; an `f32` before, 4 bytes of a
/// typical chunk's 14). Its rounding, at most 2⁻⁸ of the largest value, is
/// [`INT2_SCALE_ROUNDING`].
const INT2_SCALE: usize = 2;

/// How far an int2 chunk's scale may lie from its largest `|value|`, relative: bfloat16's
/// half unit in the last place (8 significant bits: 2⁻⁸ of the value at most), rounded to
/// nearest, ties to even.
pub const INT2_SCALE_ROUNDING: f32 = 1.0 / 256.0;

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
    /// `round(x / scale)` in -7..=7 with `scale = max|x| / 7` per chunk of [`INT4_CHUNK`],
    /// two values a byte (the first in the low nibble): 0.5625 bytes a value, error ≤
    /// scale / 2. For answers only: a worker that asks for it is sent its weights in `int8`
    /// (a weight rounded to a seventh of its chunk's largest would not train).
    Int4,
    /// `round(x / scale)` in -1..=1 with `scale = max|x|` per chunk of [`INT2_CHUNK`]: a value
    /// at least half its chunk's largest goes as its sign times the largest (rounded to a
    /// bfloat16 since protocol 15: [`INT2_SCALE_ROUNDING`]), the rest as 0. Packed by its
    /// zeros (protocol 13): a chunk of `n` values is its scale (2 bytes), a bit for each
    /// value (`⌈n/8⌉` bytes, the first value in the lowest bit of the first byte: set if it
    /// is not 0), then a bit for each value that is not, in order (`⌈nonzero/8⌉` bytes: set
    /// if it is -1), every unused bit 0. A pseudo-gradient's chunk is about four fifths
    /// zeros: 12 bytes against 18 at most (0.19 bytes a value against 0.28). For answers
    /// and deltas only, as `int4`.
    Int2,
}

impl Compression {
    /// Every encoding, in the order of their tags.
    pub const ALL: [Self; 5] = [Self::None, Self::F16, Self::Int8, Self::Int4, Self::Int2];

    pub fn to_u8(self) -> u8 {
        match self {
            Self::None => 0,
            Self::F16 => 1,
            Self::Int8 => 2,
            Self::Int4 => 3,
            Self::Int2 => 4,
        }
    }

    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::None),
            1 => Some(Self::F16),
            2 => Some(Self::Int8),
            3 => Some(Self::Int4),
            4 => Some(Self::Int2),
            _ => None,
        }
    }

    /// Payload bytes for `count` values: exactly, or at most where the length depends on
    /// the values (`int2`, [`Compression::is_sized`]: every value nonzero).
    pub fn payload_len(self, count: usize) -> Option<usize> {
        match self {
            Self::None => count.checked_mul(4),
            Self::F16 => count.checked_mul(2),
            Self::Int8 => count
                .div_ceil(INT8_CHUNK)
                .checked_mul(4)?
                .checked_add(count),
            Self::Int2 => {
                let (full, rest) = (count / INT2_CHUNK, count % INT2_CHUNK);
                let last = if rest == 0 {
                    0
                } else {
                    int2_chunk_len(rest, rest)
                };
                full.checked_mul(int2_chunk_len(INT2_CHUNK, INT2_CHUNK))?
                    .checked_add(last)
            }
            Self::Int4 => {
                let (chunk, per_byte) = (self.chunk_len(), self.per_byte());
                let (full, rest) = (count / chunk, count % chunk);
                let last = if rest == 0 {
                    0
                } else {
                    4 + rest.div_ceil(per_byte)
                };
                full.checked_mul(4 + chunk / per_byte)?.checked_add(last)
            }
        }
    }

    /// Whether `count` values always take [`Compression::payload_len`] bytes; if not
    /// (`int2`), a tensor's payload travels with its length, checked by [`int2_len`].
    pub fn is_sized(self) -> bool {
        self != Self::Int2
    }

    /// The encoding this worker's `Weights` (and frozen layers) are sent in: its own, but
    /// `int8` for `int4` and `int2`.
    pub fn for_weights(self) -> Self {
        match self {
            Self::Int4 | Self::Int2 => Self::Int8,
            c => c,
        }
    }

    /// Values that share one scale (int8 and int4), or that the rounding is judged over.
    pub fn chunk_len(self) -> usize {
        match self {
            Self::Int4 => INT4_CHUNK,
            Self::Int2 => INT2_CHUNK,
            _ => INT8_CHUNK,
        }
    }

    /// Values packed into a byte by a scaled encoding of fixed size.
    fn per_byte(self) -> usize {
        match self {
            Self::Int4 => 2,
            _ => 1,
        }
    }

    /// Whether a chunk's steps are coarse enough that its largest value, which travels
    /// exactly (`levels` times the scale), is what the checks hold to float order: `int4`
    /// and `int2`, whose half step is a fourteenth or a half of the chunk's largest.
    pub fn coarse(self) -> bool {
        matches!(self, Self::Int4 | Self::Int2)
    }

    /// How far a chunk's scale may lie from its largest `|value|`, relative: int2's bfloat16
    /// ([`INT2_SCALE_ROUNDING`]); 0 for the others, whose scales travel as `f32`.
    pub fn scale_rounding(self) -> f32 {
        match self {
            Self::Int2 => INT2_SCALE_ROUNDING,
            _ => 0.0,
        }
    }

    /// The largest level of a scaled encoding (`scale = max|x| / levels`); 0 for the others.
    pub fn levels(self) -> u8 {
        match self {
            Self::Int8 => 127,
            Self::Int4 => 7,
            Self::Int2 => 1,
            Self::None | Self::F16 => 0,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::F16 => "f16",
            Self::Int8 => "int8",
            Self::Int4 => "int4",
            Self::Int2 => "int2",
        }
    }

    /// The encoding named `name` ([`Compression::name`]'s inverse).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
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
        Compression::Int2 => {
            out.reserve(c.payload_len(values.len()).unwrap_or(0));
            for chunk in values.chunks(INT2_CHUNK) {
                // The levels are chosen against the exact largest; only its magnitude
                // travels rounded, as a bfloat16 (protocol 15).
                let scale = abs_max(chunk);
                out.extend_from_slice(&half::bf16::from_f32(scale).to_le_bytes());
                let inv = if scale > 0.0 && scale.is_finite() {
                    1.0 / scale
                } else {
                    0.0
                };
                // Each level as two bits, as int4's are four: 1 is +1, 3 is -1.
                let (mut mask, mut signs, mut nonzero) = (0u64, 0u64, 0usize);
                for (i, x) in chunk.iter().enumerate() {
                    let q = quantize(*x, inv, 1) & 0x03;
                    if q != 0 {
                        mask |= 1 << i;
                        signs |= u64::from(q >> 1) << nonzero;
                        nonzero += 1;
                    }
                }
                out.extend_from_slice(&mask.to_le_bytes()[..chunk.len().div_ceil(8)]);
                out.extend_from_slice(&signs.to_le_bytes()[..nonzero.div_ceil(8)]);
            }
        }
        Compression::Int8 | Compression::Int4 => {
            out.reserve(c.payload_len(values.len()).unwrap_or(0));
            let levels = c.levels();
            for chunk in values.chunks(c.chunk_len()) {
                // NaN or infinity make the scale non-finite, which decoding turns back into
                // non-finite values: the receiver's validation still sees them.
                let scale = abs_max(chunk) / f32::from(levels);
                out.extend_from_slice(&scale.to_le_bytes());
                let inv = if scale > 0.0 && scale.is_finite() {
                    1.0 / scale
                } else {
                    0.0
                };
                let q = |x: &f32| quantize(*x, inv, levels);
                if c == Compression::Int8 {
                    out.extend(chunk.iter().map(q));
                } else {
                    out.extend(chunk.chunks(2).map(|pair| {
                        let high = pair.get(1).map_or(0, q);
                        (q(&pair[0]) & 0x0f) | (high << 4)
                    }));
                }
            }
        }
    }
}

/// The largest `|x|` in `chunk`, or NaN if any value is NaN. Kept in 8 lanes, which the
/// compiler turns into vector compares: the result does not depend on the order (the
/// maximum is associative, and a NaN, once in a lane, stays).
fn abs_max(chunk: &[f32]) -> f32 {
    // `a` unless `m` is already NaN or at least `a`: a NaN `a` always goes in.
    fn max(m: f32, a: f32) -> f32 {
        if a > m || a.is_nan() {
            a
        } else {
            m
        }
    }
    let mut lanes = [0.0f32; 8];
    let mut blocks = chunk.chunks_exact(8);
    for block in &mut blocks {
        for (m, x) in lanes.iter_mut().zip(block) {
            *m = max(*m, x.abs());
        }
    }
    let rest = blocks.remainder().iter().fold(0.0, |m, x| max(m, x.abs()));
    lanes.into_iter().fold(rest, max)
}

/// `round(x * inv)` (half away from zero) clamped to -levels..=levels, as two's-complement
/// bits.
/// `f32::round` is a libm call per value on baseline x86-64, and `as i32` a saturating
/// conversion the compiler keeps scalar; this is the same function in operations that
/// vectorise. Adding 2^23 to `|y| ≤ 128` leaves `|y|` rounded to nearest, ties to even, in
/// the sum's low mantissa bits; `|y|` minus that integer is exact (Sterbenz), so a tie that
/// went down to even shows as exactly 0.5 and goes up instead. A NaN `y` gives 0, as
/// `NaN.round() as i8` does.
fn quantize(x: f32, inv: f32, levels: u8) -> u8 {
    const TWO_23: f32 = 8_388_608.0;
    let y = x * inv;
    let a = y.abs();
    let a = if a <= 128.0 {
        a
    } else if a > 128.0 {
        128.0
    } else {
        0.0
    };
    let shifted = a + TWO_23;
    let even = shifted.to_bits() - TWO_23.to_bits();
    let tie_went_down = a - (shifted - TWO_23) == 0.5;
    let magnitude = (even + u32::from(tie_went_down)).min(u32::from(levels)) as u8;
    if y.is_sign_negative() {
        magnitude.wrapping_neg()
    } else {
        magnitude
    }
}

/// The magnitude an `int2` chunk whose largest `|value|` is `scale` decodes its ±1 levels
/// to: `scale` through a bfloat16 (protocol 15).
pub fn int2_scale(scale: f32) -> f32 {
    half::bf16::from_f32(scale).to_f32()
}

/// The bytes of an `int2` chunk of `n` values of which `nonzero` are not 0: its scale, a
/// bit a value, a sign bit a nonzero one.
fn int2_chunk_len(n: usize, nonzero: usize) -> usize {
    INT2_SCALE + n.div_ceil(8) + nonzero.div_ceil(8)
}

/// The bytes of the `int2` payload that decodes to `values` (as a receiver decoded them:
/// each chunk's zeros are its packing's), without encoding them again.
pub fn int2_packed_len(values: &[f32]) -> usize {
    values
        .chunks(INT2_CHUNK)
        .map(|chunk| int2_chunk_len(chunk.len(), chunk.iter().filter(|v| **v != 0.0).count()))
        .sum()
}

/// The bytes of the `int2` payload of `count` values at the start of `raw`, if it is one:
/// every chunk whole (its scale, its bits, a sign bit for each bit set) and every unused bit
/// 0, so a payload has one reading and one length. `None` if `raw` ends first or a bit that
/// must be 0 is not.
pub fn int2_len(raw: &[u8], count: usize) -> Option<usize> {
    let mut pos = 0;
    let mut left = count;
    while left > 0 {
        let n = left.min(INT2_CHUNK);
        left -= n;
        let mask_bytes = raw.get(pos + INT2_SCALE..pos + INT2_SCALE + n.div_ceil(8))?;
        let mask = bits(mask_bytes);
        if mask >> (n - 1) >> 1 != 0 {
            return None;
        }
        let nonzero = mask.count_ones() as usize;
        pos += INT2_SCALE + mask_bytes.len();
        let signs = raw.get(pos..pos + nonzero.div_ceil(8))?;
        if nonzero > 0 && bits(signs) >> (nonzero - 1) >> 1 != 0 {
            return None;
        }
        pos += signs.len();
    }
    Some(pos)
}

/// Up to 8 bytes as one little-endian word.
fn bits(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(word)
}

/// Decodes a payload of `count` values; `raw` must be exactly `c.payload_len(count)` bytes
/// (for `int2`, exactly [`int2_len`]'s).
pub fn decode_payload(raw: &[u8], count: usize, c: Compression) -> Vec<f32> {
    let mut out = Vec::with_capacity(count);
    decode_payload_append(raw, count, &mut out, c);
    out
}

/// Decodes a payload of `count` values onto the end of `out`, in one pass with no
/// intermediate buffer; `raw` must be exactly `c.payload_len(count)` bytes (for `int2`, a
/// payload [`int2_len`] reads whole).
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
        // The low bits first, each level sign-extended.
        Compression::Int4 => decode_packed(raw, count, out, INT4_CHUNK, |b| {
            [(b << 4) as i8 >> 4, b as i8 >> 4]
        }),
        Compression::Int2 => decode_int2(raw, count, out),
    }
}

/// Decodes `int2` chunks: each value `level * scale`, as int4's are, its level 0 where its
/// bit is clear and ±1 by its sign bit where it is set.
fn decode_int2(raw: &[u8], count: usize, out: &mut Vec<f32>) {
    let (mut pos, mut left) = (0, count);
    while left > 0 {
        let n = left.min(INT2_CHUNK);
        left -= n;
        let scale = half::bf16::from_le_bytes([raw[pos], raw[pos + 1]]).to_f32();
        let mask_len = n.div_ceil(8);
        let mask = bits(&raw[pos + INT2_SCALE..pos + INT2_SCALE + mask_len]);
        pos += INT2_SCALE + mask_len;
        let nonzero = mask.count_ones() as usize;
        let mut signs = bits(&raw[pos..pos + nonzero.div_ceil(8)]);
        pos += nonzero.div_ceil(8);
        out.extend((0..n).map(|i| {
            let level = if mask >> i & 1 == 0 {
                0.0
            } else {
                let negative = signs & 1 == 1;
                signs >>= 1;
                if negative {
                    -1.0
                } else {
                    1.0
                }
            };
            level * scale
        }));
    }
}

/// Decodes chunks of `chunk` levels packed `PER_BYTE` a byte after each chunk's `f32`
/// scale (int4): `unpack` gives a byte's levels in order; a last partial chunk's
/// unused levels are dropped.
fn decode_packed<const PER_BYTE: usize>(
    raw: &[u8],
    count: usize,
    out: &mut Vec<f32>,
    chunk: usize,
    unpack: impl Fn(u8) -> [i8; PER_BYTE],
) {
    let mut left = count;
    for block in raw.chunks(chunk / PER_BYTE + 4) {
        let scale = f32::from_le_bytes([block[0], block[1], block[2], block[3]]);
        let n = left.min(chunk);
        left -= n;
        let levels = block[4..].iter().flat_map(|&b| unpack(b)).take(n);
        out.extend(levels.map(|q| f32::from(q) * scale));
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

    /// int8 as first written, one value at a time with `f32::round`: the reference the
    /// vectorised encoding must match byte for byte.
    fn int8_reference(values: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in values.chunks(INT8_CHUNK) {
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
        out
    }

    /// Every chunk below encodes to exactly the reference's bytes (a NaN scale only has to
    /// be NaN: which NaN's bits it carries depends on the order the maximum was taken in).
    #[test]
    fn int8_matches_the_one_value_at_a_time_reference() {
        let mut chunks: Vec<Vec<f32>> = Vec::new();
        // Scale 1 (127 in every chunk): every tie k + 0.5, the values just either side of
        // it, ±0 and ±127.
        let mut ties = Vec::new();
        for k in -127..127 {
            let t = k as f32 + 0.5;
            ties.extend([t, t.next_down(), t.next_up()]);
        }
        ties.extend([-127.0, 0.0, -0.0, 0.49999997, -0.49999997]);
        for part in ties.chunks(INT8_CHUNK - 1) {
            chunks.push([&[127.0], part].concat());
        }
        chunks.push(vec![127.5, -127.5, 127.0, 126.5, -0.5]);
        // Pseudo-random values over many magnitudes, in whole and partial chunks.
        let mut seed = 0x2545_f491_u32;
        for exp in [-140i32, -126, -60, -20, -3, 0, 3, 20, 60, 126] {
            let len = [INT8_CHUNK, 7, 1, 200][(exp.unsigned_abs() % 4) as usize];
            let chunk = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 17;
                    seed ^= seed << 5;
                    (seed as f32 / u32::MAX as f32 - 0.5) * 2f32.powi(exp)
                })
                .collect();
            chunks.push(chunk);
        }
        // Subnormal maxima (a scale of 0, or one whose inverse overflows), zeros, NaN, ±inf.
        let tiny = f32::from_bits(1);
        chunks.extend([
            vec![tiny, -tiny, 0.0],
            vec![f32::from_bits(200), -f32::from_bits(77), tiny],
            vec![0.0; 9],
            vec![1.0, f32::NAN, -3.0, f32::INFINITY],
            vec![f32::INFINITY, 2.0, -1.0],
            vec![f32::NEG_INFINITY, f32::MAX, f32::MIN],
            vec![f32::MAX, 1.0, -f32::MAX, 0.5],
        ]);
        for chunk in &chunks {
            let mut got = Vec::new();
            encode_payload(&mut got, chunk, Compression::Int8);
            let want = int8_reference(chunk);
            let scale = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            let (g, w) = (scale(&got), scale(&want));
            assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "scale {g} vs {w} for {chunk:?}"
            );
            assert_eq!(got[4..], want[4..], "{chunk:?}");
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
        assert_eq!(Compression::from_u8(5), None);
    }

    /// `n` pseudo-random values (xorshift from `seed`) over 40 binary orders of magnitude.
    fn spread(mut seed: u32, n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                (seed as f32 / u32::MAX as f32 - 0.5) * 2f32.powi(i as i32 % 40 - 20)
            })
            .collect()
    }

    /// int4 one value at a time, written plainly: `f32::round`, a clamp, then the nibbles.
    fn int4_reference(values: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in values.chunks(INT4_CHUNK) {
            let scale = chunk.iter().fold(0.0f32, |m, x| m.max(x.abs())) / 7.0;
            out.extend_from_slice(&scale.to_le_bytes());
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            let level = |x: f32| ((x * inv).round().clamp(-7.0, 7.0) as i8 as u8) & 0x0f;
            for pair in chunk.chunks(2) {
                out.push(level(pair[0]) | pair.get(1).map_or(0, |&x| level(x)) << 4);
            }
        }
        out
    }

    /// Byte for byte the reference, on every tie `k + 0.5` of the scale and either side of
    /// it, on pseudo-random chunks whole and partial; back within half a step of the chunk.
    #[test]
    fn int4_matches_the_reference_and_rounds_within_half_a_step() {
        let mut values = Vec::new();
        for k in -7..7 {
            let t = k as f32 + 0.5;
            values.extend([7.0, t, t.next_down(), t.next_up(), -0.0]);
        }
        values.extend(spread(0x9e37_79b9, 3 * INT4_CHUNK + 13));
        for len in [0, 1, 2, 63, 64, 65, 127, values.len()] {
            let values = &values[..len];
            let mut got = Vec::new();
            encode_payload(&mut got, values, Compression::Int4);
            assert_eq!(got, int4_reference(values), "{len} values");
            let back = round_trip(values, Compression::Int4);
            assert_eq!(back.len(), len);
            for (chunk, back) in values.chunks(INT4_CHUNK).zip(back.chunks(INT4_CHUNK)) {
                let step = chunk.iter().fold(0.0f32, |m, x| m.max(x.abs())) / 7.0;
                for (a, b) in chunk.iter().zip(back) {
                    assert!((a - b).abs() <= step / 2.0 * 1.0001, "{a} vs {b} ({step})");
                }
            }
        }
    }

    #[test]
    fn int4_sizes_zeros_and_non_finite() {
        let c = Compression::Int4;
        assert_eq!(c.payload_len(0), Some(0));
        assert_eq!(c.payload_len(1), Some(5));
        assert_eq!(c.payload_len(64), Some(36));
        assert_eq!(c.payload_len(129), Some(2 * 36 + 5));
        assert_eq!(c.payload_len(256 * 1024), Some(256 * 1024 / 64 * 36));
        assert_eq!(Compression::from_u8(3), Some(c));
        assert_eq!(
            (c.for_weights(), Compression::F16.for_weights()),
            (Compression::Int8, Compression::F16)
        );
        assert_eq!(round_trip(&[0.0; 100], c), vec![0.0; 100]);
        assert_eq!(
            round_trip(&[7.0, -7.0, 1.0, -3.0, 0.0], c),
            [7.0, -7.0, 1.0, -3.0, 0.0]
        );
        for bad in [f32::NAN, f32::INFINITY] {
            let back = round_trip(&[1.0, bad, 2.0], c);
            assert!(
                back.iter().any(|v| !v.is_finite()),
                "{bad} must stay detectable: {back:?}"
            );
        }
    }

    /// int2 one value at a time, written plainly: `f32::round`, a clamp, then a bit for
    /// each value that is not 0 and a sign bit for each that is.
    fn int2_reference(values: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in values.chunks(INT2_CHUNK) {
            let scale = chunk.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            // bfloat16: the top half of the f32, rounded to nearest, ties to even.
            let bits = scale.to_bits();
            let rounded = (bits + 0x7fff + (bits >> 16 & 1)) >> 16;
            out.extend_from_slice(&(rounded as u16).to_le_bytes());
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            let levels: Vec<f32> = chunk
                .iter()
                .map(|&x| (x * inv).round().clamp(-1.0, 1.0))
                .collect();
            let mut mask = vec![0u8; chunk.len().div_ceil(8)];
            let mut signs = Vec::new();
            for (i, &level) in levels.iter().enumerate() {
                if level != 0.0 {
                    mask[i / 8] |= 1 << (i % 8);
                    signs.push(level < 0.0);
                }
            }
            out.extend(mask);
            out.extend(signs.chunks(8).map(|eight| {
                eight
                    .iter()
                    .enumerate()
                    .fold(0u8, |b, (i, &neg)| b | u8::from(neg) << i)
            }));
        }
        out
    }

    /// Byte for byte the reference, on the tie (half the largest) and either side of it,
    /// on pseudo-random chunks whole and partial; back within half the chunk's largest, the
    /// largest itself exactly; its length is what [`int2_len`] reads, at most
    /// [`Compression::payload_len`].
    #[test]
    fn int2_matches_the_reference_and_rounds_within_half_a_step() {
        let mut values = Vec::new();
        for t in [0.5f32, -0.5] {
            values.extend([1.0, t, t.next_down(), t.next_up(), -0.0, -1.0, 0.25]);
        }
        values.extend(spread(0x2545_f491, 3 * INT2_CHUNK + 13));
        values.extend([0.0; INT2_CHUNK]);
        values.extend((0..INT2_CHUNK).map(|i| if i % 2 == 0 { 1.0 } else { -1.0 }));
        for len in [0, 1, 3, 4, 5, 63, 64, 65, 127, values.len()] {
            let values = &values[..len];
            let mut got = Vec::new();
            encode_payload(&mut got, values, Compression::Int2);
            assert_eq!(got, int2_reference(values), "{len} values");
            assert_eq!(int2_len(&got, len), Some(got.len()), "{len} values");
            assert!(got.len() <= Compression::Int2.payload_len(len).expect("fits"));
            let back = decode_payload(&got, len, Compression::Int2);
            assert_eq!(back.len(), len);
            for (chunk, back) in values.chunks(INT2_CHUNK).zip(back.chunks(INT2_CHUNK)) {
                let step = chunk.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                for (a, b) in chunk.iter().zip(back) {
                    let rounded = step * (1.0 + INT2_SCALE_ROUNDING);
                    assert!((a - b).abs() <= rounded / 2.0, "{a} vs {b} ({step})");
                    if a.abs() == step {
                        assert!(
                            (a - b).abs() <= step * INT2_SCALE_ROUNDING && a.signum() == b.signum(),
                            "the largest travels within its bfloat16: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }

    /// A chunk of zeros is its scale and its empty bits (10 bytes), one of signs at every
    /// value the most (18); a pseudo-gradient's four-fifths zeros about 12.
    #[test]
    fn int2_is_packed_by_its_zeros() {
        let len = |values: &[f32]| {
            let mut raw = Vec::new();
            encode_payload(&mut raw, values, Compression::Int2);
            raw.len()
        };
        assert_eq!(len(&[0.0; 64]), 10);
        assert_eq!(len(&[-1.0; 64]), 18);
        assert_eq!(Compression::Int2.payload_len(64), Some(18));
        let sparse: Vec<f32> = (0..64)
            .map(|i| if i % 5 == 0 { 1.0 } else { 0.1 })
            .collect();
        assert_eq!(len(&sparse), 10 + 2, "13 values past half the largest");
        assert_eq!(len(&[1.0, 0.0, 0.0]), 2 + 1 + 1);
    }

    fn round_trip_int2(values: &[f32]) -> Vec<f32> {
        let mut out = Vec::new();
        encode_payload(&mut out, values, Compression::Int2);
        assert_eq!(int2_len(&out, values.len()), Some(out.len()));
        decode_payload(&out, values.len(), Compression::Int2)
    }

    #[test]
    fn int2_sizes_levels_names_and_non_finite() {
        let c = Compression::Int2;
        assert_eq!(c.payload_len(0), Some(0));
        assert_eq!(c.payload_len(1), Some(4));
        assert_eq!(c.payload_len(9), Some(6));
        assert_eq!(c.payload_len(64), Some(18));
        assert_eq!(c.payload_len(129), Some(2 * 18 + 4));
        assert!(!c.is_sized() && Compression::ALL.iter().filter(|c| !c.is_sized()).count() == 1);
        assert_eq!(Compression::from_u8(4), Some(c));
        assert_eq!(c.for_weights(), Compression::Int8);
        assert!(c.coarse() && Compression::Int4.coarse() && !Compression::Int8.coarse());
        for c in Compression::ALL {
            assert_eq!(Compression::from_name(c.name()), Some(c));
            assert_eq!(Compression::from_u8(c.to_u8()), Some(c));
        }
        assert_eq!(Compression::from_name("int3"), None);
        assert_eq!(round_trip_int2(&[0.0; 100]), vec![0.0; 100]);
        assert_eq!(
            round_trip_int2(&[2.0, -2.0, 1.0, -0.9, 0.0]),
            [2.0, -2.0, 2.0, 0.0, 0.0]
        );
        for bad in [f32::NAN, f32::INFINITY] {
            let back = round_trip_int2(&[1.0, bad, 2.0]);
            assert!(
                back.iter().any(|v| !v.is_finite()),
                "{bad} must stay detectable: {back:?}"
            );
        }
    }

    /// A payload has one reading: one that ends inside a chunk's scale, bits or signs, or
    /// sets a bit past its values or its signs, is not one; and what a hostile one can say
    /// is still only -1, 0 or 1 times its scale.
    #[test]
    fn int2_payloads_that_are_not_whole_and_canonical_are_not_read() {
        let scale = half::bf16::ONE.to_le_bytes();
        // 10 values: two bytes of bits; values 0 and 9 set, one sign byte (value 9 negative).
        let good = [&scale[..], &[0b0000_0001, 0b0000_0010], &[0b0000_0010]].concat();
        assert_eq!(int2_len(&good, 10), Some(good.len()));
        assert_eq!(
            decode_payload(&good, 10, Compression::Int2),
            [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0]
        );
        for cut in 0..good.len() {
            assert_eq!(int2_len(&good[..cut], 10), None, "cut at {cut}");
        }
        let past_the_values = [&scale[..], &[0b0000_0001, 0b0000_0110], &[0]].concat();
        assert_eq!(int2_len(&past_the_values, 10), None);
        let past_the_signs = [&scale[..], &[0b0000_0001, 0b0000_0010], &[0b0000_0100]].concat();
        assert_eq!(int2_len(&past_the_signs, 10), None);
        // A longer buffer is read to the payload's end only: the rest is the caller's.
        let longer = [&good[..], &[0xff]].concat();
        assert_eq!(int2_len(&longer, 10), Some(good.len()));
        // Every mask and sign a chunk can carry decodes to -1, 0 or 1 times its scale.
        for mask in 0..=255u8 {
            let n = mask.count_ones() as usize;
            let signs = if n == 0 {
                vec![]
            } else {
                vec![0xffu8 >> (8 - n)]
            };
            let raw = [
                &half::bf16::from_f32(2.0).to_le_bytes()[..],
                &[mask],
                &signs,
            ]
            .concat();
            assert_eq!(int2_len(&raw, 8), Some(raw.len()));
            let back = decode_payload(&raw, 8, Compression::Int2);
            assert!(
                back.iter().all(|v| [-2.0, 0.0].contains(v)),
                "{mask}: {back:?}"
            );
        }
    }
}
