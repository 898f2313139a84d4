//! How raw values become model inputs: `(v - mean) / std`, with one `(mean, std)` for all
//! features or one per feature.

use crate::error::ModelError;

#[derive(Debug, Clone, PartialEq)]
pub struct Normalization {
    mean: Vec<f32>,
    std: Vec<f32>,
}

impl Normalization {
    /// Bytes to `[0, 1]`: mean 0, std 255 (so a pixel becomes exactly `p / 255`).
    pub fn unit_bytes() -> Self {
        Self {
            mean: vec![0.0],
            std: vec![255.0],
        }
    }

    /// One `(mean, std)` for every feature, or one per feature.
    pub fn new(mean: Vec<f32>, std: Vec<f32>) -> Self {
        Self { mean, std }
    }

    /// Per-feature standardisation fitted to `values` (sample-major, `features` each); a
    /// constant feature gets std 1.
    pub fn fit(values: &[f32], features: usize) -> Self {
        let n = (values.len() / features.max(1)).max(1) as f64;
        let (mut sum, mut sq) = (vec![0.0f64; features], vec![0.0f64; features]);
        for row in values.chunks_exact(features) {
            for (j, &v) in row.iter().enumerate() {
                sum[j] += f64::from(v);
                sq[j] += f64::from(v) * f64::from(v);
            }
        }
        let mean: Vec<f64> = sum.iter().map(|s| s / n).collect();
        let std = sq
            .iter()
            .zip(&mean)
            .map(|(q, m)| (q / n - m * m).max(0.0).sqrt())
            .map(|s| if s > 1e-12 { s as f32 } else { 1.0 })
            .collect();
        Self {
            mean: mean.iter().map(|&m| m as f32).collect(),
            std,
        }
    }

    pub fn mean(&self) -> &[f32] {
        &self.mean
    }

    pub fn std(&self) -> &[f32] {
        &self.std
    }

    pub(crate) fn check(&self, features: usize) -> Result<(), ModelError> {
        let len = self.mean.len();
        if len != self.std.len() || (len != 1 && len != features) {
            return Err(ModelError::ShapeMismatch {
                what: "normalisation entries (1 or one per feature)",
                expected: features,
                got: len,
            });
        }
        if self.mean.iter().any(|m| !m.is_finite())
            || self.std.iter().any(|s| !s.is_finite() || *s <= 0.0)
        {
            return Err(ModelError::BadNormalization);
        }
        Ok(())
    }

    pub(crate) fn apply(&self, values: impl Iterator<Item = f32>, out: &mut Vec<f32>) {
        if let ([mean], [std]) = (&self.mean[..], &self.std[..]) {
            out.extend(values.map(|v| (v - mean) / std));
        } else {
            let stats = self.mean.iter().zip(&self.std);
            out.extend(values.zip(stats).map(|(v, (m, s))| (v - m) / s));
        }
    }
}
