//! Labelled datasets (8-bit images or `f32` feature vectors), their normalisation, and how
//! they are cut into shards and batches.
//!
//! Parsing takes bytes, not paths (sans-IO): the coordinator reads the files, and the
//! browser never parses files at all, it receives its shard over the wire.

mod idx;
mod normalization;
mod sampling;

use ndarray::Array2;

pub use normalization::Normalization;
pub use sampling::{assign_shards, batch_positions};

use crate::error::ModelError;
use crate::rng::SplitMix64;
use crate::spec::Shape;

/// The samples' values, sample-major, in the dataset's own element type.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    /// Pixel intensities 0..=255.
    U8(Vec<u8>),
    /// Numeric features (from a CSV file).
    F32(Vec<f32>),
}

impl Values {
    pub fn len(&self) -> usize {
        match self {
            Self::U8(v) => v.len(),
            Self::F32(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn select(&self, indices: &[usize], features: usize) -> Self {
        fn pick<T: Copy>(v: &[T], indices: &[usize], features: usize) -> Vec<T> {
            let mut out = Vec::with_capacity(indices.len() * features);
            for &i in indices {
                out.extend_from_slice(&v[i * features..(i + 1) * features]);
            }
            out
        }
        match self {
            Self::U8(v) => Self::U8(pick(v, indices, features)),
            Self::F32(v) => Self::F32(pick(v, indices, features)),
        }
    }
}

/// Samples (values plus one class label each), their shape and how to normalise them.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    shape: Shape,
    values: Values,
    labels: Vec<u8>,
    norm: Normalization,
}

impl Dataset {
    /// 8-bit samples of `features` values each, scaled to `[0, 1]` for training.
    pub fn new(features: usize, pixels: Vec<u8>, labels: Vec<u8>) -> Result<Self, ModelError> {
        Self::from_parts(
            Shape::flat(features),
            Values::U8(pixels),
            labels,
            Normalization::unit_bytes(),
        )
    }

    /// Checks that the parts agree: `labels.len() × shape` values, a normalisation of one
    /// or `shape.len()` entries.
    pub fn from_parts(
        shape: Shape,
        values: Values,
        labels: Vec<u8>,
        norm: Normalization,
    ) -> Result<Self, ModelError> {
        let features = shape.len();
        if features == 0 || values.len() != labels.len() * features {
            return Err(ModelError::ShapeMismatch {
                what: "values (labels × features)",
                expected: labels.len() * features,
                got: values.len(),
            });
        }
        norm.check(features)?;
        Ok(Self {
            shape,
            values,
            labels,
            norm,
        })
    }

    /// Parses uncompressed IDX files: images (magic 2051, `n × rows × cols` u8) and labels
    /// (magic 2049, `n` u8). The shape is `1 × rows × cols`.
    pub fn from_idx(images: &[u8], labels: &[u8]) -> Result<Self, ModelError> {
        let (shape, pixels, labels) = idx::parse(images, labels)?;
        Self::from_parts(
            shape,
            Values::U8(pixels),
            labels,
            Normalization::unit_bytes(),
        )
    }

    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Values per sample.
    pub fn features(&self) -> usize {
        self.shape.len()
    }

    pub fn shape(&self) -> Shape {
        self.shape
    }

    pub fn labels(&self) -> &[u8] {
        &self.labels
    }

    pub fn values(&self) -> &Values {
        &self.values
    }

    pub fn normalization(&self) -> &Normalization {
        &self.norm
    }

    /// The same samples with another normalisation (checked against the features).
    pub fn with_normalization(mut self, norm: Normalization) -> Result<Self, ModelError> {
        norm.check(self.features())?;
        self.norm = norm;
        Ok(self)
    }

    /// Number of distinct classes, assuming labels `0..=max`.
    pub fn classes(&self) -> usize {
        self.labels.iter().max().map_or(0, |&m| m as usize + 1)
    }

    /// `(shape, values, labels, normalisation)`, giving up ownership without copying.
    pub fn into_parts(self) -> (Shape, Values, Vec<u8>, Normalization) {
        (self.shape, self.values, self.labels, self.norm)
    }

    /// The samples at `indices`, in that order.
    pub fn select(&self, indices: &[usize]) -> Self {
        Self {
            shape: self.shape,
            values: self.values.select(indices, self.features()),
            labels: indices.iter().map(|&i| self.labels[i]).collect(),
            norm: self.norm.clone(),
        }
    }

    /// Samples `range` as a new dataset (what one shard carries).
    pub fn slice(&self, range: std::ops::Range<usize>) -> Self {
        self.select(&range.collect::<Vec<_>>())
    }

    /// Shuffles with `seed`, then cuts into `(first train_len, rest)`. Files are often
    /// grouped by class, so the shuffle is what makes both parts representative.
    pub fn shuffled_split(&self, seed: u64, train_len: usize) -> (Self, Self) {
        let mut order: Vec<usize> = (0..self.len()).collect();
        SplitMix64::new(seed).shuffle(&mut order);
        let train_len = train_len.min(self.len());
        (
            self.select(&order[..train_len]),
            self.select(&order[train_len..]),
        )
    }

    /// The samples at `positions` as a normalised `f32` matrix, plus their labels.
    pub fn batch(&self, positions: impl IntoIterator<Item = usize>) -> (Array2<f32>, Vec<u8>) {
        let features = self.features();
        let mut data = Vec::new();
        let mut labels = Vec::new();
        for i in positions {
            let range = i * features..(i + 1) * features;
            match &self.values {
                Values::U8(v) => self
                    .norm
                    .apply(v[range].iter().map(|&p| f32::from(p)), &mut data),
                Values::F32(v) => self.norm.apply(v[range].iter().copied(), &mut data),
            }
            labels.push(self.labels[i]);
        }
        let x = Array2::from_shape_vec((labels.len(), features), data)
            .expect("rows × features elements");
        (x, labels)
    }
}

#[cfg(test)]
mod tests;
