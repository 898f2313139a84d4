//! The IDX format of MNIST and Fashion-MNIST.

use crate::error::ModelError;
use crate::spec::Shape;

/// Images (magic 2051, `n × rows × cols` u8) and labels (magic 2049, `n` u8), uncompressed.
pub(super) fn parse(images: &[u8], labels: &[u8]) -> Result<(Shape, Vec<u8>, Vec<u8>), ModelError> {
    let be = |b: &[u8], at: usize| -> Result<usize, ModelError> {
        b.get(at..at + 4)
            .map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]) as usize)
            .ok_or_else(|| ModelError::Idx(format!("header cut short at byte {at}")))
    };
    if be(images, 0)? != 2051 {
        return Err(ModelError::Idx("images: magic is not 2051".into()));
    }
    if be(labels, 0)? != 2049 {
        return Err(ModelError::Idx("labels: magic is not 2049".into()));
    }
    let (n, rows, cols) = (be(images, 4)?, be(images, 8)?, be(images, 12)?);
    if be(labels, 4)? != n {
        return Err(ModelError::Idx(format!(
            "{n} images but {} labels",
            be(labels, 4)?
        )));
    }
    let features = rows.checked_mul(cols).filter(|&f| f > 0);
    let pixels = features
        .and_then(|f| f.checked_mul(n))
        .and_then(|len| images.get(16..).filter(|p| p.len() == len))
        .ok_or_else(|| ModelError::Idx(format!("images: expected {n}×{rows}×{cols} bytes")))?;
    let label_bytes = labels
        .get(8..)
        .filter(|l| l.len() == n)
        .ok_or_else(|| ModelError::Idx(format!("labels: expected {n} bytes")))?;
    Ok((
        Shape::new(1, rows, cols),
        pixels.to_vec(),
        label_bytes.to_vec(),
    ))
}
