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
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
    /// A Hugging Face `tokenizer.json` (BPE as GPT-2's, or any model that format holds).
    File(Arc<Pretrained>),
}

/// Which tokeniser `--tokenizer` names: `char`, `byte`, or the path of a `tokenizer.json`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TokenizerKind {
    #[default]
    Char,
    Byte,
    File(PathBuf),
}

impl std::str::FromStr for TokenizerKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "char" => Ok(Self::Char),
            "byte" => Ok(Self::Byte),
            "" => Err("`char`, `byte`, or the path of a tokenizer.json".into()),
            path => Ok(Self::File(PathBuf::from(path))),
        }
    }
}

impl Tokenizer {
    /// The tokeniser of `kind` for this corpus; a `tokenizer.json` that does not load is an
    /// error naming the file and why.
    pub fn fit(kind: &TokenizerKind, text: &str) -> Result<Self, String> {
        Ok(match kind {
            TokenizerKind::Char => {
                Self::Chars(text.chars().collect::<BTreeSet<_>>().into_iter().collect())
            }
            TokenizerKind::Byte => Self::Bytes,
            TokenizerKind::File(path) => Self::File(Arc::new(Pretrained::load(path)?)),
        })
    }

    pub fn vocab(&self) -> usize {
        match self {
            Self::Chars(chars) => chars.len(),
            Self::Bytes => 256,
            Self::File(file) => file.pieces.len(),
        }
    }

    /// Whether a model of `vocab` tokens reads this tokeniser's ids: an error saying both
    /// sizes if not.
    pub fn fits(&self, vocab: usize) -> Result<(), String> {
        if self.vocab() == vocab {
            return Ok(());
        }
        Err(format!(
            "the {} tokeniser has {} tokens, the model {vocab}",
            self.kind(),
            self.vocab()
        ))
    }

    /// The ids of `text`; a character outside the vocabulary is an error naming it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        match self {
            Self::Bytes => Ok(text.bytes().map(u32::from).collect()),
            Self::File(file) => file.encode(text),
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
            Self::File(file) => {
                let bytes: Vec<u8> = ids
                    .iter()
                    .flat_map(|&i| {
                        file.pieces
                            .get(i)
                            .map_or(&b"\xEF\xBF\xBD"[..], Vec::as_slice)
                    })
                    .copied()
                    .collect();
                String::from_utf8_lossy(&bytes).into_owned()
            }
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
            Self::File(file) => coordinator_core::Vocabulary::new(file.pieces.clone(), "token"),
        }
    }

    /// `char`, `byte`, `tokenizer.json`: for the status and the logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Chars(_) => "char",
            Self::Bytes => "byte",
            Self::File(_) => "tokenizer.json",
        }
    }
}

/// A Hugging Face `tokenizer.json`, read with the `tokenizers` crate, and each token's bytes:
/// what the model's samples are written with, one token at a time.
pub struct Pretrained {
    /// Where it was read from (for messages): the file, or the checkpoint that kept it.
    path: PathBuf,
    /// The file's text, as read: what a checkpoint keeps and an export writes.
    json: String,
    inner: tokenizers::Tokenizer,
    /// Each id's bytes: a byte-level BPE's token in GPT-2's byte alphabet mapped back to
    /// the bytes it stands for (a token may be part of a character); else the token decoded
    /// alone.
    pieces: Vec<Vec<u8>>,
}

impl Pretrained {
    /// Reads `path`; its vocabulary must be within [`MAX_CHAR_VOCAB`] ids.
    pub fn load(path: &Path) -> Result<Self, String> {
        let json = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Self::parse(json, path)
    }

    /// A `tokenizer.json`'s text, read from `path` (named in errors).
    pub fn parse(json: String, path: &Path) -> Result<Self, String> {
        let at = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
        let inner: tokenizers::Tokenizer = json.parse().map_err(|e| at(&e))?;
        let vocab = inner.get_vocab_size(true);
        if vocab == 0 || vocab > MAX_CHAR_VOCAB {
            return Err(at(&format!(
                "{vocab} tokens; a vocabulary of 1 to {MAX_CHAR_VOCAB} is needed"
            )));
        }
        let byte_level = matches!(
            inner.get_decoder(),
            Some(tokenizers::DecoderWrapper::ByteLevel(_))
        );
        let unbyte = byte_level.then(byte_alphabet);
        let pieces = (0..vocab as u32)
            .map(|id| {
                let token = inner.id_to_token(id).unwrap_or_default();
                let from_alphabet = unbyte.as_ref().and_then(|unbyte| {
                    token
                        .chars()
                        .map(|c| unbyte.get(&c).copied())
                        .collect::<Option<Vec<u8>>>()
                });
                from_alphabet.unwrap_or_else(|| {
                    let alone = inner.decode(&[id], false).unwrap_or(token);
                    alone.into_bytes()
                })
            })
            .collect();
        Ok(Self {
            path: path.to_path_buf(),
            json,
            inner,
            pieces,
        })
    }

    /// The `tokenizer.json` as it was read.
    pub fn json(&self) -> &str {
        &self.json
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        let encoding = self
            .inner
            .encode(text, false)
            .map_err(|e| format!("{}: {e}", self.path.display()))?;
        Ok(encoding.get_ids().to_vec())
    }
}

impl std::fmt::Debug for Pretrained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pretrained")
            .field("path", &self.path)
            .field("vocab", &self.pieces.len())
            .finish_non_exhaustive()
    }
}

/// Two tokenisers read from files are the same if their tokens are.
impl PartialEq for Pretrained {
    fn eq(&self, other: &Self) -> bool {
        self.pieces == other.pieces
    }
}

impl Eq for Pretrained {}

/// GPT-2's byte alphabet, inverted: the printable character each byte is written as in a
/// byte-level BPE's vocabulary, back to the byte (printable Latin-1 stands for itself; the
/// rest, in order, for U+0100 onwards).
fn byte_alphabet() -> std::collections::HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0u32;
    (0..=255u8)
        .map(|b| {
            let c = if printable(b) {
                char::from(b)
            } else {
                next += 1;
                char::from_u32(255 + next).expect("below U+0200")
            };
            (c, b)
        })
        .collect()
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
    kind: &TokenizerKind,
    seed: u64,
) -> Result<Split, DataError> {
    let (text, source) = read(path)?;
    let at = || path.unwrap_or(Path::new("embedded"));
    let tokenizer = Tokenizer::fit(kind, &text).map_err(|e| DataError::at(at(), e))?;
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
        let t = Tokenizer::fit(&TokenizerKind::Char, "hello, world\n").unwrap();
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
        let b = Tokenizer::fit(&TokenizerKind::Byte, "").unwrap();
        assert_eq!(b.encode("é").unwrap(), [0xC3, 0xA9]);
        assert_eq!(b.decode(&[0xC3, 0xA9]), "é");
    }

    #[test]
    fn the_embedded_text_splits_into_windows_of_the_stream() {
        let split = load(None, 64, &TokenizerKind::Char, 1).unwrap();
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
        let split = load(Some(dir.path()), 8, &TokenizerKind::Byte, 1).unwrap();
        assert_eq!(split.classes.len(), 256);
        let short = dir.path().join("short.txt");
        std::fs::write(&short, "tiny").unwrap();
        let err = load(Some(&short), 8, &TokenizerKind::Char, 1).unwrap_err();
        assert!(err.to_string().contains("too few"), "{err}");
        std::fs::write(&short, [0xff, 0xfe]).unwrap();
        assert!(load(Some(&short), 8, &TokenizerKind::Char, 1)
            .unwrap_err()
            .to_string()
            .contains("not UTF-8"));
    }

    /// The repository's BPE (`data/shakespeare-bpe`, written by Hugging Face `tokenizers` with
    /// `scripts/fixtures/bpe_fixture.py`): the same ids as `tokenizers` in Python gave, the
    /// text back from them, and each token's bytes as GPT-2's byte alphabet says (an emoji
    /// spans tokens that are not characters alone).
    #[test]
    fn a_tokenizer_json_gives_the_ids_hugging_face_gave_and_its_text_back() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/shakespeare-bpe");
        let expected: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
        let text = expected["text"].as_str().unwrap();
        let ids: Vec<u32> = expected["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let kind: TokenizerKind = dir
            .join("tokenizer.json")
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let t = Tokenizer::fit(&kind, "").unwrap();
        assert_eq!(t.vocab(), 512);
        assert_eq!(t.encode(text).unwrap(), ids);
        let back: Vec<usize> = ids.iter().map(|&i| i as usize).collect();
        assert_eq!(t.decode(&back), text);
        // Token by token, as a sample is written: the pieces' bytes concatenate to the text.
        assert_eq!(t.vocabulary().decode(&back), text);
        let emoji = t.encode("🎭").unwrap();
        assert!(emoji.len() > 1, "{emoji:?}");
        let alone = t.decode(&[emoji[0] as usize]);
        assert!(alone.contains('\u{FFFD}'), "part of a character: {alone:?}");
        assert!(t.names()[back[0]].chars().count() >= 1);
        // The whole corpus: 1.9 bytes a token, windows as for characters.
        let split = load(None, 32, &kind, 1).unwrap();
        let data = split.text.as_ref().unwrap();
        assert_eq!(split.classes.len(), 512);
        assert_eq!((data.tokens, data.bytes), (605_021, 1_158_218));
        // A file that is not a tokeniser is refused by name.
        let bad: TokenizerKind = dir.join("expected.json").to_str().unwrap().parse().unwrap();
        let err = Tokenizer::fit(&bad, "").unwrap_err();
        assert!(err.contains("expected.json"), "{err}");
        let missing = TokenizerKind::File(dir.join("nope.json"));
        assert!(load(None, 32, &missing, 1)
            .unwrap_err()
            .to_string()
            .contains("nope.json"));
    }
}
