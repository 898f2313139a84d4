//! Why a check refuted an answer: a mismatch (a strike), or a segment just outside its
//! tolerance (more segments asked for, no strike).

/// Why a recomputation refuted an answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Refuted {
    /// It does not match: a strike.
    Mismatch(String),
    /// A segment of a committed phase just outside its tolerance (`segment::MARGINAL`):
    /// more segments are asked for, not a strike.
    Marginal { segment: u32, why: String },
}

impl std::fmt::Display for Refuted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Mismatch(why) => f.write_str(why),
            Self::Marginal { segment, why } => write!(f, "segment {segment} is marginal: {why}"),
        }
    }
}
