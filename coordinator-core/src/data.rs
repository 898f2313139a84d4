//! The data a run trains and evaluates on, already loaded and split (the server reads CSV,
//! IDX and image folders; tests and the simulator build it directly).

use model::Dataset;

/// A train split (cut into the workers' shards) and a test split (which never leaves the
/// coordinator).
#[derive(Debug, Clone)]
pub struct Data {
    pub train: Dataset,
    pub test: Dataset,
    /// Class names, by label.
    pub classes: Vec<String>,
    /// One line for the status and the page: source, sizes, shape and classes.
    pub description: String,
    /// A language model's tokens' text (the model writes a sample after each evaluation).
    pub vocabulary: Option<crate::Vocabulary>,
}

/// The 10,000 MNIST digits the server embeds, split 8,000 / 2,000 as it splits them with
/// `seed`: for tests.
#[cfg(test)]
pub(crate) fn digits(seed: u64) -> Data {
    static DIGITS: std::sync::OnceLock<Dataset> = std::sync::OnceLock::new();
    let all = DIGITS.get_or_init(|| model::digits::embedded().expect("the embedded digits"));
    let (train, test) = all.clone().shuffled_split(seed ^ 0x5EED_DA7A, 8_000);
    Data {
        train,
        test,
        classes: (0..10).map(|c| c.to_string()).collect(),
        description: "embedded MNIST".into(),
        vocabulary: None,
    }
}
