//! The 10,000 MNIST digits crowdtrain embeds (feature `digits`): 28×28 pixels and a label
//! each, from `data/` (see its README for where they come from).

use std::io::Read;

use crate::data::Dataset;
use crate::error::ModelError;

static IMAGES_GZ: &[u8] = include_bytes!("../../data/mnist10k-images-idx3-ubyte.gz");
static LABELS_GZ: &[u8] = include_bytes!("../../data/mnist10k-labels-idx1-ubyte.gz");

/// All 10,000 digits, in the files' order.
pub fn embedded() -> Result<Dataset, ModelError> {
    let gunzip = |bytes: &[u8]| -> Result<Vec<u8>, ModelError> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(bytes)
            .read_to_end(&mut out)
            .map_err(|e| ModelError::Idx(format!("gzip: {e}")))?;
        Ok(out)
    };
    Dataset::from_idx(&gunzip(IMAGES_GZ)?, &gunzip(LABELS_GZ)?)
}
