//! A directory of IDX files in the MNIST layout: `<prefix>-images-idx3-ubyte[.gz]` with
//! `<prefix>-labels-idx1-ubyte[.gz]` beside it. Every pair found is used (MNIST's `train`
//! and `t10k` pairs become one pool, split again by `--test-fraction`).

use std::path::{Path, PathBuf};

use model::{Dataset, Normalization, Values};

use super::{gunzip, DataError, Loaded};

const IMAGES: &str = "-images-idx3-ubyte";
const LABELS: &str = "-labels-idx1-ubyte";

/// The image/label pairs in `dir`, or `None` if it holds no IDX images file.
pub(super) fn find(dir: &Path) -> Result<Option<Vec<(PathBuf, PathBuf)>>, DataError> {
    let entries = std::fs::read_dir(dir).map_err(|e| DataError::at(dir, e.to_string()))?;
    let mut pairs = Vec::new();
    let mut names: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    names.sort();
    for images in &names {
        let Some(name) = images.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(at) = name.find(IMAGES) else {
            continue;
        };
        let candidates = [
            format!("{}{LABELS}", &name[..at]),
            format!("{}{LABELS}.gz", &name[..at]),
        ];
        let labels = candidates
            .iter()
            .map(|c| dir.join(c))
            .find(|p| p.is_file())
            .ok_or_else(|| {
                DataError::at(
                    images,
                    format!("no labels file {} beside it", candidates[0]),
                )
            })?;
        pairs.push((images.clone(), labels));
    }
    Ok((!pairs.is_empty()).then_some(pairs))
}

fn read(path: &Path) -> Result<Vec<u8>, DataError> {
    let raw = std::fs::read(path).map_err(|e| DataError::at(path, e.to_string()))?;
    if path.extension().is_some_and(|e| e == "gz") {
        gunzip(&raw).map_err(|e| DataError::at(path, format!("gzip: {e}")))
    } else {
        Ok(raw)
    }
}

pub(super) fn load(pairs: &[(PathBuf, PathBuf)]) -> Result<Loaded, DataError> {
    let mut parts: Vec<Dataset> = Vec::new();
    for (images, labels) in pairs {
        let part = Dataset::from_idx(&read(images)?, &read(labels)?)
            .map_err(|e| DataError::at(images, e.to_string()))?;
        if let Some(first) = parts.first() {
            if first.shape() != part.shape() {
                return Err(DataError::at(
                    images,
                    format!(
                        "images of {}, but {} has {}",
                        part.shape(),
                        pairs[0].0.display(),
                        first.shape()
                    ),
                ));
            }
        }
        parts.push(part);
    }
    let shape = parts[0].shape();
    let (mut pixels, mut labels) = (Vec::new(), Vec::new());
    for part in parts {
        let (_, values, l, _) = part.into_parts();
        if let Values::U8(v) = values {
            pixels.extend(v);
        }
        labels.extend(l);
    }
    let data = Dataset::from_parts(
        shape,
        Values::U8(pixels),
        labels,
        Normalization::unit_bytes(),
    )?;
    Ok(Loaded::numbered(data))
}
