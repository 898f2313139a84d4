//! The training data: the embedded MNIST digits by default, or `--data PATH` (a CSV file,
//! an IDX directory, a folder of class folders of images), split into a seeded train part
//! (shared out to workers) and test part (which never leaves the coordinator).

mod csv_file;
mod idx_dir;
mod images;
pub mod text;

use std::io::Read;
use std::path::{Path, PathBuf};

use flate2::read::GzDecoder;
use model::{Dataset, ModelError, Network, Normalization, Values};

use crate::config::model_choice::ModelChoice;
use thiserror::Error;

pub use text::{TextData, Tokenizer, TokenizerKind};

/// Most classes a dataset may have (labels travel as one byte).
pub const MAX_CLASSES: usize = 256;

/// Why the data cannot be used, naming the file and the line or entry at fault.
#[derive(Debug, Error)]
pub enum DataError {
    #[error("{path}: {reason}")]
    At { path: PathBuf, reason: String },
    #[error("{0}")]
    Model(#[from] ModelError),
}

impl DataError {
    pub(crate) fn at(path: &Path, reason: impl Into<String>) -> Self {
        Self::At {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }
}

/// The seeded, shuffled split and what it is.
#[derive(Debug, Clone)]
pub struct Split {
    pub train: Dataset,
    pub test: Dataset,
    /// Where the data came from (`embedded MNIST`, a path).
    pub source: String,
    /// Class names, by label (a language model's: its tokens, by id).
    pub classes: Vec<String>,
    /// A language model's text: its tokeniser and size.
    pub text: Option<TextData>,
}

impl Split {
    /// The network `choice` makes for this data's shape and classes, checked layer by layer.
    pub fn network(&self, choice: &ModelChoice) -> Result<Network, ModelError> {
        let classes = self.classes.len();
        Network::new(choice.spec(self.train.shape(), classes), classes)
    }

    /// What the coordinator's core trains on.
    pub fn data(&self) -> coordinator_core::Data {
        coordinator_core::Data {
            train: self.train.clone(),
            test: self.test.clone(),
            classes: self.classes.clone(),
            description: self.describe(),
            vocabulary: self.text.as_ref().map(|t| t.tokenizer.vocabulary()),
        }
    }

    /// One line for the status and the page: source, sizes, shape and classes.
    pub fn describe(&self) -> String {
        let mut names = self
            .classes
            .iter()
            .take(12)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if self.classes.len() > 12 {
            names.push_str(", …");
        }
        format!(
            "{}: {} train / {} test samples of {}, {} classes ({names})",
            self.source,
            self.train.len(),
            self.test.len(),
            self.train.shape(),
            self.classes.len()
        )
    }
}

/// All samples before the split, with their class names.
pub(crate) struct Loaded {
    pub data: Dataset,
    pub classes: Vec<String>,
}

impl Loaded {
    /// Classes named by their label (`0`, `1`, ...), as IDX files have them.
    fn numbered(data: Dataset) -> Self {
        let classes = (0..data.classes()).map(|c| c.to_string()).collect();
        Self { data, classes }
    }
}

/// What `model` trains on: text for a GPT ([`text::load`]), else [`load`].
pub fn load_for(
    model: &ModelChoice,
    path: Option<&Path>,
    tokenizer: &TokenizerKind,
    seed: u64,
    test_fraction: f64,
) -> Result<Split, DataError> {
    match model.gpt_spec(2) {
        Some(gpt) => text::load(path, gpt.context, tokenizer, seed),
        None => match path {
            Some(p) if text::is_text(p) || (p.is_dir() && text::is_text_folder(p)) => Err(
                DataError::at(p, "text trains a language model: add --model gpt"),
            ),
            _ => load(path, seed, test_fraction),
        },
    }
}

/// Loads `path` (or the embedded MNIST) and splits it: `test_fraction` of the samples,
/// rounded, at least one, go to the test split. `f32` features are standardised with the
/// train split's statistics.
pub fn load(path: Option<&Path>, seed: u64, test_fraction: f64) -> Result<Split, DataError> {
    let (loaded, source) = match path {
        None => (embedded()?, "embedded MNIST".to_string()),
        Some(p) if p.is_dir() => {
            let loaded = match idx_dir::find(p)? {
                Some(pairs) => idx_dir::load(&pairs)?,
                None => images::load(p)?,
            };
            (loaded, p.display().to_string())
        }
        Some(p) if p.extension().is_some_and(|e| e.eq_ignore_ascii_case("csv")) => {
            (csv_file::load(p)?, p.display().to_string())
        }
        Some(p) if !p.exists() => return Err(DataError::at(p, "no such file or directory")),
        Some(p) => {
            return Err(DataError::at(
                p,
                "not a .csv file or a directory (of IDX files or of class folders of images)",
            ))
        }
    };
    let at = |reason: String| match path {
        Some(p) => DataError::at(p, reason),
        None => DataError::at(Path::new("embedded"), reason),
    };
    let n = loaded.data.len();
    if loaded.classes.len() < 2 {
        return Err(at(format!(
            "only one class ({}): a classifier needs at least two",
            loaded.classes.first().map_or("none", String::as_str)
        )));
    }
    let test_len = ((n as f64 * test_fraction).round() as usize).max(1);
    if n < test_len + 1 {
        return Err(at(format!(
            "{n} samples are too few for a train and a test split"
        )));
    }
    // A fixed offset decorrelates the split's shuffle from the weight initialisation.
    let (train, test) = loaded.data.shuffled_split(seed ^ 0x5EED_DA7A, n - test_len);
    let (train, test) = match train.values() {
        Values::F32(v) => {
            let norm = Normalization::fit(v, train.features());
            (
                train.with_normalization(norm.clone())?,
                test.with_normalization(norm)?,
            )
        }
        Values::U8(_) => (train, test),
    };
    Ok(Split {
        train,
        test,
        source,
        classes: loaded.classes,
        text: None,
    })
}

fn embedded() -> Result<Loaded, DataError> {
    Ok(Loaded::numbered(model::digits::embedded()?))
}

fn gunzip(bytes: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    GzDecoder::new(bytes).read_to_end(&mut out)?;
    Ok(out)
}

/// The embedded MNIST with the default split (8,000 train / 2,000 test).
pub fn load_default(seed: u64) -> Result<Split, DataError> {
    load(None, seed, 0.2)
}

#[cfg(test)]
mod tests;
