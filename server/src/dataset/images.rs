//! A folder of class folders of images: `DIR/<class>/*.png` (or `.jpg`, `.jpeg`). Classes
//! are the folder names in sorted order. Every image must have the same size; if any is in
//! colour all become RGB (3 channels), otherwise grayscale (1 channel).

use std::path::{Path, PathBuf};

use image::DynamicImage;
use model::{Dataset, Normalization, Shape, Values};

use super::{DataError, Loaded, MAX_CLASSES};

fn is_image(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| ["png", "jpg", "jpeg"].contains(&e.to_ascii_lowercase().as_str()))
}

fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>, DataError> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| DataError::at(dir, e.to_string()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    out.sort();
    Ok(out)
}

pub(super) fn load(dir: &Path) -> Result<Loaded, DataError> {
    let class_dirs: Vec<PathBuf> = sorted_entries(dir)?
        .into_iter()
        .filter(|p| p.is_dir())
        .collect();
    if class_dirs.is_empty() {
        return Err(DataError::at(
            dir,
            "no IDX files and no class folders (expected DIR/<class>/*.png or *.jpg)",
        ));
    }
    if class_dirs.len() > MAX_CLASSES {
        return Err(DataError::at(
            dir,
            format!(
                "{} class folders; at most {MAX_CLASSES} are supported",
                class_dirs.len()
            ),
        ));
    }
    let mut decoded: Vec<(PathBuf, DynamicImage, u8)> = Vec::new();
    let mut classes = Vec::new();
    for (label, class_dir) in (0..=u8::MAX).zip(&class_dirs) {
        let files: Vec<PathBuf> = sorted_entries(class_dir)?
            .into_iter()
            .filter(|p| is_image(p))
            .collect();
        if files.is_empty() {
            return Err(DataError::at(
                class_dir,
                "class folder holds no PNG or JPEG images",
            ));
        }
        for file in files {
            let img = image::ImageReader::open(&file)
                .and_then(|r| r.with_guessed_format())
                .map_err(|e| DataError::at(&file, e.to_string()))?
                .decode()
                .map_err(|e| DataError::at(&file, format!("cannot decode the image: {e}")))?;
            if let Some((first, first_img, _)) = decoded.first() {
                if (img.width(), img.height()) != (first_img.width(), first_img.height()) {
                    return Err(DataError::at(
                        &file,
                        format!(
                            "is {}×{}, but {} is {}×{}: every image must have the same size",
                            img.width(),
                            img.height(),
                            first.display(),
                            first_img.width(),
                            first_img.height()
                        ),
                    ));
                }
            }
            decoded.push((file, img, label));
        }
        classes.push(
            class_dir
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        );
    }
    let color = decoded.iter().any(|(_, img, _)| img.color().has_color());
    let (w, h) = (
        decoded[0].1.width() as usize,
        decoded[0].1.height() as usize,
    );
    let channels = if color { 3 } else { 1 };
    let mut pixels = Vec::with_capacity(decoded.len() * channels * w * h);
    let mut labels = Vec::with_capacity(decoded.len());
    for (_, img, label) in decoded {
        if color {
            // Interleaved RGB to channel-major planes.
            let rgb = img.to_rgb8();
            for c in 0..3 {
                pixels.extend(rgb.pixels().map(|p| p.0[c]));
            }
        } else {
            pixels.extend_from_slice(img.to_luma8().as_raw());
        }
        labels.push(label);
    }
    let data = Dataset::from_parts(
        Shape::new(channels, h, w),
        Values::U8(pixels),
        labels,
        Normalization::unit_bytes(),
    )?;
    Ok(Loaded { data, classes })
}
