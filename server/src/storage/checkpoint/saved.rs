//! The counters, bans and tokeniser as `state.json` writes them: the file's own types, converted from
//! and to the coordinator's, so that renaming a counter there is a change here, not a new
//! file format.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use coordinator_core::metrics::Counters;
use serde::{Deserialize, Serialize};

use crate::dataset::text::Pretrained;
use crate::dataset::Tokenizer;

/// The run's counters on disk. A field missing from an older file reads as 0.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SavedCounters {
    pub gradients_accepted: u64,
    pub gradients_rejected: u64,
    pub late: u64,
    pub stale_rejected: u64,
    pub duplicate_rejected: u64,
    pub gradients_clipped: u64,
    pub updates_refused: u64,
    pub gradients_verified: u64,
    pub verification_mismatches: u64,
    pub answered_total: u64,
    pub samples_seen: u64,
    pub deadline_closes: u64,
    pub deadline_extensions: u64,
    pub resumed: u64,
    pub sessions_rejected: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub probation_checks: u64,
    pub probation_unchecked: u64,
    pub branches_logged: u64,
    pub branches_forced: u64,
}

/// Bans and strikes on disk, so a banned worker or address stays out across a restart.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SavedBans {
    pub workers: Vec<u32>,
    pub addresses: Vec<IpAddr>,
    /// (worker id, strikes).
    pub strikes: Vec<(u32, u32)>,
    pub address_strikes: Vec<(IpAddr, u32)>,
    /// (worker id, answers accepted since it was issued or last struck): the trust each
    /// identity has earned.
    pub trusted: Vec<(u32, u64)>,
}

/// Field by field, both ways: the two lists below must name the same fields.
macro_rules! same_fields {
    ($from:ty => $to:ty { $($field:ident),* $(,)? }) => {
        impl From<&$from> for $to {
            fn from(c: &$from) -> Self {
                Self { $($field: c.$field.clone()),* }
            }
        }
        impl From<$to> for $from {
            fn from(c: $to) -> Self {
                Self { $($field: c.$field),* }
            }
        }
    };
}

same_fields!(Counters => SavedCounters {
    gradients_accepted, gradients_rejected, late, stale_rejected, duplicate_rejected,
    gradients_clipped, updates_refused, gradients_verified, verification_mismatches,
    answered_total, samples_seen, deadline_closes, deadline_extensions, resumed,
    sessions_rejected, bytes_in, bytes_out, probation_checks, probation_unchecked,
    branches_logged, branches_forced,
});

same_fields!(coordinator_core::registry::SavedBans => SavedBans {
    workers, addresses, strikes, address_strikes, trusted,
});

/// A language model's tokeniser on disk, so that `coordinator sample` and `export` read a
/// checkpoint's text without being given the run's corpus and tokeniser again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", deny_unknown_fields)]
pub enum SavedTokenizer {
    /// The corpus's distinct characters, in id order.
    #[serde(rename = "char")]
    Chars { characters: String },
    #[serde(rename = "byte")]
    Bytes,
    /// A Hugging Face `tokenizer.json`, whole.
    #[serde(rename = "tokenizer.json")]
    File { json: String },
}

impl From<&Tokenizer> for SavedTokenizer {
    fn from(t: &Tokenizer) -> Self {
        match t {
            Tokenizer::Chars(chars) => Self::Chars {
                characters: chars.iter().collect(),
            },
            Tokenizer::Bytes => Self::Bytes,
            Tokenizer::File(file) => Self::File {
                json: file.json().to_string(),
            },
        }
    }
}

impl SavedTokenizer {
    /// The tokeniser again; `origin` names the checkpoint in errors.
    pub fn tokenizer(&self, origin: &Path) -> Result<Tokenizer, String> {
        Ok(match self {
            Self::Chars { characters } => {
                let chars: Vec<char> = characters.chars().collect();
                if chars.is_empty() || !chars.windows(2).all(|w| w[0] < w[1]) {
                    return Err(format!(
                        "{}: the character vocabulary is not in code point order",
                        origin.display()
                    ));
                }
                Tokenizer::Chars(chars)
            }
            Self::Bytes => Tokenizer::Bytes,
            Self::File { json } => {
                Tokenizer::File(Arc::new(Pretrained::parse(json.clone(), origin)?))
            }
        })
    }
}
