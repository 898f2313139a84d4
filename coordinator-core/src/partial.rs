//! What an edge hands its root for one round (`--role edge`, docs/CLUSTER.md).

/// An edge's contribution to one round: its workers' combined gradient, weighted by the
/// samples behind it.
#[derive(Debug, Clone, PartialEq)]
pub struct Partial {
    /// The version the gradient was computed on (the round).
    pub round: u64,
    /// The mean gradient of the edge's accepted answers (sample-weighted, or its robust
    /// aggregator's combination).
    pub gradient: Vec<f32>,
    /// Samples behind it: the root's weight for it.
    pub samples: u64,
    /// Sample-weighted mean of the workers' reported losses.
    pub mean_loss: f64,
    /// Answers combined.
    pub answered: usize,
}
