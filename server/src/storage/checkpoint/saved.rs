//! The bans and tokeniser as `state.json` writes them: the file's own types, converted from
//! and to the coordinator's, so that renaming a field there is a change here, not a new file
//! format. The counters are written as the coordinator defines them (`coordinator_core::
//! counters`, one list): a counter added there is in the next checkpoint, and a file from
//! before it reads it as 0.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::dataset::text::Pretrained;
use crate::dataset::Tokenizer;

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
