//! Errors of the model maths and data parsing.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ModelError {
    #[error("a model needs at least an input and an output layer, got {0} layer sizes")]
    TooFewLayers(usize),
    #[error("layer {index} has width 0")]
    ZeroWidth { index: usize },
    #[error("{what}: expected {expected}, got {got}")]
    ShapeMismatch {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("label {label} at sample {index} is out of range for {classes} classes")]
    LabelOutOfRange {
        index: usize,
        label: u8,
        classes: usize,
    },
    #[error("value {index} of the windows is not a token id below the vocabulary of {vocab}")]
    TokenOutOfRange { index: usize, vocab: usize },
    #[error("not supported: {0}")]
    Unsupported(&'static str),
    #[error("batch is empty")]
    EmptyBatch,
    #[error("a phase's state computed elsewhere: {0}")]
    BadState(String),
    #[error(transparent)]
    Spec(#[from] crate::spec::SpecError),
    #[error("normalisation: every mean must be finite and every std finite and positive")]
    BadNormalization,
    #[error("invalid IDX data: {0}")]
    Idx(String),
}
