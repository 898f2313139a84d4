//! Text for a language model: `--data FILE.txt` (or a folder of `.txt` files, in name
//! order), or the embedded Shakespeare, tokenised here on the coordinator; workers only
//! ever receive token ids.
//!
//! The token stream's first nine tenths train and its last tenth validates. A sample is a
//! window of `context + 1` ids: training windows start every `context / 4` tokens and are
//! shuffled with the run's seed (shards are sets of windows, and a batch is named by the
//! coordinator's rule, so any answer can be replayed); validation windows do not overlap,
//! at most [`MAX_VALIDATION_WINDOWS`] of them spread over the last tenth.

use std::collections::BTreeSet;
use std::path::Path;

use model::{Dataset, Normalization, Shape, Values};

use super::{gunzip, DataError, Split};

/// Eight Shakespeare tragedies (`data/README.md`).
static SHAKESPEARE: &[u8] = include_bytes!("../../../data/shakespeare8.txt.gz");

/// Validation windows at most: an evaluation of the 0.8M-parameter model then takes about
/// as long as 20 training batches (nanoGPT evaluates on 200 batches of 12).
pub const MAX_VALIDATION_WINDOWS: usize = 256;

/// Most distinct characters a character vocabulary may have (ids travel as `f32`, exact
/// below 2^24; the model's size is the real bound).
pub const MAX_CHAR_VOCAB: usize = 65_536;

/// How text becomes token ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tokenizer {
    /// One id per distinct character of the corpus, in code point order (nanoGPT's
    /// `shakespeare_char`).
    Chars(Vec<char>),
    /// One id per byte (256).
    Bytes,
}

/// Which tokeniser `--tokenizer` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum TokenizerKind {
    #[default]
    Char,
    Byte,
}

impl Tokenizer {
    /// The tokeniser of `kind` for this corpus.
    pub fn fit(kind: TokenizerKind, text: &str) -> Self {
        match kind {
            TokenizerKind::Char => {
                Self::Chars(text.chars().collect::<BTreeSet<_>>().into_iter().collect())
            }
            TokenizerKind::Byte => Self::Bytes,
        }
    }

    pub fn vocab(&self) -> usize {
        match self {
            Self::Chars(chars) => chars.len(),
            Self::Bytes => 256,
        }
    }

    /// The ids of `text`; a character outside the vocabulary is an error naming it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        match self {
            Self::Bytes => Ok(text.bytes().map(u32::from).collect()),
            Self::Chars(chars) => text
                .chars()
                .map(|c| match chars.binary_search(&c) {
                    Ok(i) => Ok(i as u32),
                    Err(_) => Err(format!("{c:?} is not in the vocabulary")),
                })
                .collect(),
        }
    }

    /// The text of `ids` (ids outside the vocabulary, and bytes that are not UTF-8, as
    /// U+FFFD).
    pub fn decode(&self, ids: &[usize]) -> String {
        match self {
            Self::Bytes => {
                let bytes: Vec<u8> = ids
                    .iter()
                    .map(|&i| u8::try_from(i).unwrap_or(b'?'))
                    .collect();
                String::from_utf8_lossy(&bytes).into_owned()
            }
            Self::Chars(chars) => ids
                .iter()
                .map(|&i| chars.get(i).copied().unwrap_or('\u{FFFD}'))
                .collect(),
        }
    }

    /// Each token's name, by id (what the status calls the classes).
    pub fn names(&self) -> Vec<String> {
        (0..self.vocab())
            .map(|i| self.decode(&[i]).escape_debug().to_string())
            .collect()
    }

    /// Each token's text, for the core's samples.
    pub fn vocabulary(&self) -> coordinator_core::Vocabulary {
        match self {
            Self::Chars(chars) => coordinator_core::Vocabulary::new(
                chars.iter().map(|c| c.to_string().into_bytes()).collect(),
                "character",
            ),
            Self::Bytes => {
                coordinator_core::Vocabulary::new((0..=255u8).map(|b| vec![b]).collect(), "byte")
            }
        }
    }

    /// `char`, `byte`: for the status and the logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Chars(_) => "char",
            Self::Bytes => "byte",
        }
    }
}

/// Reads `path` (a `.txt` file, or a folder of them in name order), or the embedded
/// Shakespeare.
pub fn read(path: Option<&Path>) -> Result<(String, String), DataError> {
    let Some(path) = path else {
        let bytes =
            gunzip(SHAKESPEARE).map_err(|e| DataError::at(Path::new("embedded"), e.to_string()))?;
        let text = String::from_utf8(bytes)
            .map_err(|e| DataError::at(Path::new("embedded"), e.to_string()))?;
        return Ok((text, "embedded Shakespeare (8 tragedies)".into()));
    };
    let files = if path.is_dir() {
        let mut files: Vec<_> = std::fs::read_dir(path)
            .map_err(|e| DataError::at(path, e.to_string()))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| is_text(p))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(DataError::at(path, "the folder has no .txt files"));
        }
        files
    } else {
        vec![path.to_path_buf()]
    };
    let mut text = String::new();
    for file in &files {
        let bytes = std::fs::read(file).map_err(|e| DataError::at(file, e.to_string()))?;
        let part = String::from_utf8(bytes)
            .map_err(|e| DataError::at(file, format!("not UTF-8 text: {e}")))?;
        text.push_str(&part);
    }
    Ok((text, path.display().to_string()))
}

/// Whether `path` names a text file (`.txt`).
pub fn is_text(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("txt"))
}

/// Whether `path` is a folder of text files (and none of anything else the loader knows).
pub fn is_text_folder(path: &Path) -> bool {
    std::fs::read_dir(path)
        .is_ok_and(|entries| entries.filter_map(Result::ok).any(|e| is_text(&e.path())))
}

/// The text of `path` (or the embedded one) as windows of `context + 1` token ids.
pub fn load(
    path: Option<&Path>,
    context: usize,
    kind: TokenizerKind,
    seed: u64,
) -> Result<Split, DataError> {
    let (text, source) = read(path)?;
    let at = || path.unwrap_or(Path::new("embedded"));
    let tokenizer = Tokenizer::fit(kind, &text);
    if tokenizer.vocab() > MAX_CHAR_VOCAB {
        return Err(DataError::at(
            at(),
            format!(
                "{} distinct characters, more than {MAX_CHAR_VOCAB}: use --tokenizer byte",
                tokenizer.vocab()
            ),
        ));
    }
    let ids = tokenizer
        .encode(&text)
        .map_err(|e| DataError::at(at(), e))?;
    let split = ids.len() - ids.len() / 10;
    let (train_ids, test_ids) = ids.split_at(split);
    let width = context + 1;
    if test_ids.len() < width || train_ids.len() < width {
        return Err(DataError::at(
            at(),
            format!(
                "{} tokens are too few: each tenth of the stream needs a window of {width}",
                ids.len()
            ),
        ));
    }
    let stride = (context / 4).max(1);
    let train_starts: Vec<usize> = (0..=train_ids.len() - width).step_by(stride).collect();
    let all_test: Vec<usize> = (0..=test_ids.len() - width).step_by(context).collect();
    let keep = all_test.len().min(MAX_VALIDATION_WINDOWS);
    let test_starts: Vec<usize> = (0..keep)
        .map(|i| all_test[i * all_test.len() / keep])
        .collect();
    let windows = |stream: &[u32], starts: &[usize]| -> Result<Dataset, DataError> {
        let values = if tokenizer.vocab() <= 256 {
            Values::U8(
                starts
                    .iter()
                    .flat_map(|&s| stream[s..s + width].iter().map(|&id| id as u8))
                    .collect(),
            )
        } else {
            Values::F32(
                starts
                    .iter()
                    .flat_map(|&s| stream[s..s + width].iter().map(|&id| id as f32))
                    .collect(),
            )
        };
        // Ids are the model's input as they are: mean 0, std 1.
        let identity = Normalization::new(vec![0.0], vec![1.0]);
        Ok(Dataset::from_parts(
            Shape::flat(width),
            values,
            vec![0; starts.len()],
            identity,
        )?)
    };
    let train = windows(train_ids, &train_starts)?;
    let (train, _) = train.shuffled_split(seed ^ 0x5EED_DA7A, train.len());
    let test = windows(test_ids, &test_starts)?;
    Ok(Split {
        train,
        test,
        source,
        classes: tokenizer.names(),
        text: Some(TextData {
            tokenizer,
            tokens: ids.len(),
            bytes: text.len(),
        }),
    })
}

/// What a text split adds: how to turn ids back into text, and the stream's size.
#[derive(Debug, Clone, PartialEq)]
pub struct TextData {
    pub tokenizer: Tokenizer,
    /// Tokens in the whole stream, and the bytes they came from (bits per byte: the loss
    /// times tokens over bytes).
    pub tokens: usize,
    pub bytes: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn characters_are_the_corpus_distinct_ones_in_order_and_round_trip() {
        let t = Tokenizer::fit(TokenizerKind::Char, "hello, world\n");
        assert_eq!(t.vocab(), 10);
        let ids = t.encode("low, hell").unwrap();
        assert_eq!(
            t.decode(&ids.iter().map(|&i| i as usize).collect::<Vec<_>>()),
            "low, hell"
        );
        assert_eq!(
            t.encode("hello!").unwrap_err(),
            "'!' is not in the vocabulary"
        );
        let b = Tokenizer::fit(TokenizerKind::Byte, "");
        assert_eq!(b.encode("é").unwrap(), [0xC3, 0xA9]);
        assert_eq!(b.decode(&[0xC3, 0xA9]), "é");
    }

    #[test]
    fn the_embedded_text_splits_into_windows_of_the_stream() {
        let split = load(None, 64, TokenizerKind::Char, 1).unwrap();
        let text = split.text.as_ref().unwrap();
        assert_eq!(
            (text.bytes, text.tokens, split.classes.len()),
            (1_158_218, 1_158_218, 73)
        );
        assert_eq!(split.train.shape(), Shape::flat(65));
        // Train windows every 16 tokens of the first 9/10, validation ones apart in the last.
        let train_tokens = 1_158_218 - 115_821;
        assert_eq!(split.train.len(), (train_tokens - 65) / 16 + 1);
        assert_eq!(split.test.len(), MAX_VALIDATION_WINDOWS);
        // A window decodes to a stretch of the corpus.
        let (full, _) = read(None).unwrap();
        let (x, _) = split.test.batch([3]);
        let ids: Vec<usize> = x.iter().map(|&v| v as usize).collect();
        assert!(full[train_tokens..].contains(&text.tokenizer.decode(&ids)));
    }

    #[test]
    fn a_folder_of_text_files_is_one_stream_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.txt"), "world ".repeat(40)).unwrap();
        std::fs::write(dir.path().join("a.txt"), "hello ".repeat(40)).unwrap();
        std::fs::write(dir.path().join("notes.md"), "ignored").unwrap();
        let (text, _) = read(Some(dir.path())).unwrap();
        assert!(text.starts_with("hello ") && text.ends_with("world "));
        let split = load(Some(dir.path()), 8, TokenizerKind::Byte, 1).unwrap();
        assert_eq!(split.classes.len(), 256);
        let short = dir.path().join("short.txt");
        std::fs::write(&short, "tiny").unwrap();
        let err = load(Some(&short), 8, TokenizerKind::Char, 1).unwrap_err();
        assert!(err.to_string().contains("too few"), "{err}");
        std::fs::write(&short, [0xff, 0xfe]).unwrap();
        assert!(load(Some(&short), 8, TokenizerKind::Char, 1)
            .unwrap_err()
            .to_string()
            .contains("not UTF-8"));
    }
}
