//! Datasets of 8-bit images with class labels, and how they are cut into shards and batches.
//!
//! Parsing takes bytes, not paths (sans-IO): the coordinator decompresses the embedded
//! files and the browser never parses files at all, it receives its shard over the wire.

use std::ops::Range;

use ndarray::Array2;

use crate::error::ModelError;
use crate::rng::SplitMix64;

/// Samples as raw pixel bytes (sample-major) plus one label each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dataset {
    features: usize,
    pixels: Vec<u8>,
    labels: Vec<u8>,
}

impl Dataset {
    pub fn new(features: usize, pixels: Vec<u8>, labels: Vec<u8>) -> Result<Self, ModelError> {
        if features == 0 || pixels.len() != labels.len() * features {
            return Err(ModelError::ShapeMismatch {
                what: "pixels (labels × features)",
                expected: labels.len() * features,
                got: pixels.len(),
            });
        }
        Ok(Self {
            features,
            pixels,
            labels,
        })
    }

    /// Parses uncompressed IDX files: images (magic 2051, `n × rows × cols` u8) and labels
    /// (magic 2049, `n` u8).
    pub fn from_idx(images: &[u8], labels: &[u8]) -> Result<Self, ModelError> {
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
        let features = rows * cols;
        let pixels = images
            .get(16..)
            .filter(|p| p.len() == n * features)
            .ok_or_else(|| ModelError::Idx(format!("images: expected {n}×{rows}×{cols} bytes")))?;
        let label_bytes = labels
            .get(8..)
            .filter(|l| l.len() == n)
            .ok_or_else(|| ModelError::Idx(format!("labels: expected {n} bytes")))?;
        Self::new(features, pixels.to_vec(), label_bytes.to_vec())
    }

    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    pub fn features(&self) -> usize {
        self.features
    }

    pub fn labels(&self) -> &[u8] {
        &self.labels
    }

    pub fn pixels(&self) -> &[u8] {
        &self.pixels
    }

    /// Number of distinct classes, assuming labels `0..=max`.
    pub fn classes(&self) -> usize {
        self.labels.iter().max().map_or(0, |&m| m as usize + 1)
    }

    /// `(features, pixels, labels)`, giving up ownership without copying.
    pub fn into_parts(self) -> (usize, Vec<u8>, Vec<u8>) {
        (self.features, self.pixels, self.labels)
    }

    /// The samples at `indices`, in that order.
    pub fn select(&self, indices: &[usize]) -> Self {
        let mut pixels = Vec::with_capacity(indices.len() * self.features);
        for &i in indices {
            pixels.extend_from_slice(self.sample(i));
        }
        Self {
            features: self.features,
            pixels,
            labels: indices.iter().map(|&i| self.labels[i]).collect(),
        }
    }

    /// Samples `range` as a new dataset (what one shard carries).
    pub fn slice(&self, range: Range<usize>) -> Self {
        Self {
            features: self.features,
            pixels: self.pixels[range.start * self.features..range.end * self.features].to_vec(),
            labels: self.labels[range].to_vec(),
        }
    }

    fn sample(&self, i: usize) -> &[u8] {
        &self.pixels[i * self.features..(i + 1) * self.features]
    }

    /// Shuffles with `seed`, then cuts into `(first train_len, rest)`. The raw files are
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

    /// The samples at `positions` as an `f32` matrix scaled to `[0, 1]`, plus their labels.
    pub fn batch(&self, positions: impl IntoIterator<Item = usize>) -> (Array2<f32>, Vec<u8>) {
        let mut data = Vec::new();
        let mut labels = Vec::new();
        for i in positions {
            data.extend(self.sample(i).iter().map(|&p| f32::from(p) / 255.0));
            labels.push(self.labels[i]);
        }
        let x = Array2::from_shape_vec((labels.len(), self.features), data)
            .expect("rows × features elements");
        (x, labels)
    }
}

/// Cuts `len` samples into `workers` contiguous shards whose sizes differ by at most one.
/// Worker `k` (in ascending worker-id order) gets shard `k`.
pub fn assign_shards(workers: usize, len: usize) -> Vec<Range<usize>> {
    if workers == 0 {
        return Vec::new();
    }
    let (base, extra) = (len / workers, len % workers);
    let mut start = 0;
    (0..workers)
        .map(|k| {
            let size = base + usize::from(k < extra);
            let range = start..start + size;
            start += size;
            range
        })
        .collect()
}

/// Which positions of a shard of `shard_len` samples make the batch for `round`: `batch`
/// consecutive positions (fewer if the shard is smaller), starting at `round · batch`,
/// wrapping around. Workers and the test reference both call this, so a round's batches are
/// known exactly.
pub fn batch_positions(shard_len: usize, round: u64, batch: usize) -> impl Iterator<Item = usize> {
    let n = batch.min(shard_len);
    let start = if shard_len == 0 {
        0
    } else {
        ((u128::from(round) * batch as u128) % shard_len as u128) as usize
    };
    (0..n).map(move |i| (start + i) % shard_len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idx(n: usize, rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
        let mut images = Vec::new();
        for v in [2051u32, n as u32, rows as u32, cols as u32] {
            images.extend_from_slice(&v.to_be_bytes());
        }
        images.extend((0..n * rows * cols).map(|i| (i % 256) as u8));
        let mut labels = Vec::new();
        labels.extend_from_slice(&2049u32.to_be_bytes());
        labels.extend_from_slice(&(n as u32).to_be_bytes());
        labels.extend((0..n).map(|i| (i % 10) as u8));
        (images, labels)
    }

    #[test]
    fn parses_idx_and_rejects_bad_files() {
        let (images, labels) = idx(5, 2, 3);
        let d = Dataset::from_idx(&images, &labels).expect("valid");
        assert_eq!((d.len(), d.features(), d.classes()), (5, 6, 5));
        assert_eq!(d.sample(1), &[6, 7, 8, 9, 10, 11]);

        assert!(Dataset::from_idx(&images[..10], &labels).is_err());
        assert!(Dataset::from_idx(&images[..images.len() - 1], &labels).is_err());
        assert!(Dataset::from_idx(&labels, &images).is_err());
        let (other_images, _) = idx(4, 2, 3);
        assert!(Dataset::from_idx(&other_images, &labels).is_err());
    }

    #[test]
    fn split_is_seeded_and_a_partition() {
        let (images, labels) = idx(50, 1, 1);
        let d = Dataset::from_idx(&images, &labels).expect("valid");
        let (a, b) = d.shuffled_split(1, 40);
        assert_eq!((a.len(), b.len()), (40, 10));
        assert_eq!(d.shuffled_split(1, 40), (a.clone(), b.clone()));
        assert_ne!(d.shuffled_split(2, 40).0, a);
        let mut all: Vec<u8> = a.pixels().iter().chain(b.pixels()).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..50).collect::<Vec<u8>>());
    }

    #[test]
    fn shards_cover_everything_once_and_differ_by_at_most_one() {
        for workers in 1..20 {
            for len in [0, 1, 7, 8000] {
                let shards = assign_shards(workers, len);
                assert_eq!(shards.len(), workers);
                assert_eq!(shards[0].start, 0);
                assert_eq!(shards[workers - 1].end, len);
                assert!(shards.windows(2).all(|w| w[0].end == w[1].start));
                let sizes: Vec<_> = shards.iter().map(|r| r.len()).collect();
                assert!(sizes.iter().max().unwrap_or(&0) - sizes.iter().min().unwrap_or(&0) <= 1);
            }
        }
    }

    #[test]
    fn batches_walk_the_shard_and_wrap() {
        assert_eq!(batch_positions(10, 0, 4).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert_eq!(batch_positions(10, 2, 4).collect::<Vec<_>>(), [8, 9, 0, 1]);
        assert_eq!(batch_positions(3, 5, 4).collect::<Vec<_>>(), [2, 0, 1]);
        assert_eq!(batch_positions(0, 5, 4).count(), 0);
        assert_eq!(batch_positions(7, u64::MAX, 3).count(), 3);
    }

    #[test]
    fn batch_scales_pixels_to_unit_range() {
        let d = Dataset::new(2, vec![0, 255, 51, 102], vec![3, 4]).expect("valid");
        let (x, y) = d.batch([1, 0]);
        assert_eq!(x, ndarray::array![[0.2, 0.4], [0.0, 1.0]]);
        assert_eq!(y, [4, 3]);
        assert!(Dataset::new(2, vec![0], vec![1]).is_err());
    }
}
