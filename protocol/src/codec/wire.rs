//! The byte-level primitives of the codec: a [`Writer`] that starts a frame with its header,
//! and a [`Reader`] that checks every length against the bytes left before taking them.

use super::{DecodeError, HEADER_LEN, MAGIC};
use crate::tensor::{decode_payload, encode_payload, int2_len, Compression};
use crate::PROTOCOL_VERSION;

pub(super) struct Writer {
    pub(super) buf: Vec<u8>,
}

impl Writer {
    pub(super) fn new(tag: u8, payload_hint: usize) -> Self {
        let mut buf = Vec::with_capacity(HEADER_LEN + payload_hint);
        buf.extend_from_slice(&MAGIC);
        buf.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        buf.push(tag);
        Self { buf }
    }
    pub(super) fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub(super) fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub(super) fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub(super) fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub(super) fn f32(&mut self, v: f32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    /// Strings are capped at `u16::MAX` bytes; longer ones are cut at a char boundary.
    pub(super) fn str(&mut self, s: &str) {
        let mut end = s.len().min(u16::MAX as usize);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.u16(end as u16);
        self.buf.extend_from_slice(&s.as_bytes()[..end]);
    }
    pub(super) fn opt_str(&mut self, s: Option<&str>) {
        match s {
            None => self.u8(0),
            Some(s) => {
                self.u8(1);
                self.str(s);
            }
        }
    }
    /// Bytes whose length the reader knows (a count said before them).
    pub(super) fn raw(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }
    pub(super) fn bytes(&mut self, b: &[u8]) {
        self.u32(len_u32(b.len()));
        self.buf.extend_from_slice(b);
    }
    /// A tensor chunk: where it sits in its tensor, then its values.
    pub(super) fn chunk(&mut self, (total, offset): (u32, u32), v: &[f32], c: Compression) {
        self.u32(total);
        self.u32(offset);
        self.tensor(v, c);
    }

    /// A tensor: its encoding, its count, the payload's length where the values set it
    /// (`int2`), then the payload.
    pub(super) fn tensor(&mut self, v: &[f32], c: Compression) {
        self.u8(c.to_u8());
        self.u32(len_u32(v.len()));
        let at = self.buf.len();
        if !c.is_sized() {
            self.u32(0);
        }
        encode_payload(&mut self.buf, v, c);
        if !c.is_sized() {
            let len = len_u32(self.buf.len() - at - 4);
            self.buf[at..at + 4].copy_from_slice(&len.to_le_bytes());
        }
    }
}

fn len_u32(len: usize) -> u32 {
    u32::try_from(len).expect("a message field over 4 GiB cannot be encoded")
}

pub(super) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn new(frame: &'a [u8]) -> Self {
        Self { buf: frame, pos: 0 }
    }

    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let left = self.buf.len() - self.pos;
        if n > left {
            return Err(DecodeError::Truncated {
                offset: self.pos,
                needed: n - left,
            });
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }
    pub(super) fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
    pub(super) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    pub(super) fn u16(&mut self) -> Result<u16, DecodeError> {
        self.array().map(u16::from_le_bytes)
    }
    pub(super) fn u32(&mut self) -> Result<u32, DecodeError> {
        self.array().map(u32::from_le_bytes)
    }
    pub(super) fn u64(&mut self) -> Result<u64, DecodeError> {
        self.array().map(u64::from_le_bytes)
    }
    pub(super) fn f32(&mut self) -> Result<f32, DecodeError> {
        self.array().map(f32::from_le_bytes)
    }
    pub(super) fn str(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let len = self.u16()? as usize;
        let raw = self.take(len)?;
        std::str::from_utf8(raw)
            .map(str::to_owned)
            .map_err(|_| DecodeError::InvalidUtf8(field))
    }
    pub(super) fn opt_str(&mut self, field: &'static str) -> Result<Option<String>, DecodeError> {
        match self.u8()? {
            0 => Ok(None),
            1 => self.str(field).map(Some),
            v => Err(DecodeError::InvalidValue {
                field,
                value: v.into(),
            }),
        }
    }
    /// A `u32` count followed by `count * elem_size` bytes, checked before use.
    pub(super) fn counted(&mut self, elem_size: usize) -> Result<(usize, &'a [u8]), DecodeError> {
        let count = self.u32()? as usize;
        // count <= u32::MAX and elem_size <= 4, so this cannot overflow a 64-bit usize;
        // checked anyway for 32-bit targets (wasm32).
        let len = count
            .checked_mul(elem_size)
            .ok_or(DecodeError::InvalidValue {
                field: "length",
                value: count as u64,
            })?;
        Ok((count, self.take(len)?))
    }
    pub(super) fn bytes(&mut self) -> Result<Vec<u8>, DecodeError> {
        self.counted(1).map(|(_, b)| b.to_vec())
    }
    pub(super) fn compression(&mut self, field: &'static str) -> Result<Compression, DecodeError> {
        let v = self.u8()?;
        Compression::from_u8(v).ok_or(DecodeError::InvalidValue {
            field,
            value: v.into(),
        })
    }
    /// Checks the payload length against the frame before decoding (and allocating).
    pub(super) fn tensor(&mut self) -> Result<Vec<f32>, DecodeError> {
        let (c, count, raw) = self.raw_tensor()?;
        Ok(decode_payload(raw, count, c))
    }

    /// A tensor's encoding, count and payload bytes, not decoded: a payload whose length
    /// travels with it (`int2`) is read whole and canonical ([`int2_len`]) before it is
    /// given out, so decoding it cannot fail.
    pub(super) fn raw_tensor(&mut self) -> Result<(Compression, usize, &'a [u8]), DecodeError> {
        let c = self.compression("tensor encoding")?;
        let count = self.u32()? as usize;
        let most = c.payload_len(count).ok_or(DecodeError::InvalidValue {
            field: "length",
            value: count as u64,
        })?;
        if c.is_sized() {
            return Ok((c, count, self.take(most)?));
        }
        let len = self.u32()? as usize;
        if len > most {
            return Err(DecodeError::InvalidValue {
                field: "payload length",
                value: len as u64,
            });
        }
        let raw = self.take(len)?;
        if int2_len(raw, count) != Some(len) {
            return Err(DecodeError::InvalidValue {
                field: "int2 payload",
                value: len as u64,
            });
        }
        Ok((c, count, raw))
    }

    pub(super) fn finish(self) -> Result<(), DecodeError> {
        match self.buf.len() - self.pos {
            0 => Ok(()),
            n => Err(DecodeError::TrailingBytes(n)),
        }
    }
}
