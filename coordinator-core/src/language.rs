//! A language model's run as people read it: the validation loss as perplexity and bits
//! per token (per character with a character tokeniser), and the text the model writes
//! after each evaluation, so that everyone watches it improve.

use model::gpt::Sampling;
use serde::Serialize;

/// Each token's text, by id, as bytes (a byte tokeniser's tokens are not UTF-8 alone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vocabulary {
    pieces: Vec<Vec<u8>>,
    /// What one token is: `character` or `byte`.
    unit: &'static str,
}

impl Vocabulary {
    pub fn new(pieces: Vec<Vec<u8>>, unit: &'static str) -> Self {
        Self { pieces, unit }
    }

    pub fn unit(&self) -> &'static str {
        self.unit
    }

    /// The text of `ids`; ids outside the vocabulary and bytes that are not UTF-8 become
    /// U+FFFD.
    pub fn decode(&self, ids: &[usize]) -> String {
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&i| self.pieces.get(i).map_or(&[0xFF][..], |p| &p[..]))
            .copied()
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// The validation loss read three ways, for the status, the dashboard and `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LossReadings {
    /// `exp(loss)`: as many equally likely tokens as the model hesitates between.
    pub perplexity: f64,
    /// `loss / ln 2`: bits per token; per character with `unit` `character`.
    pub bits_per_token: f64,
    pub unit: &'static str,
}

impl LossReadings {
    /// `loss` in nats per token.
    pub fn of(loss: f64, unit: &'static str) -> Self {
        Self {
            perplexity: loss.exp(),
            bits_per_token: loss / std::f64::consts::LN_2,
            unit,
        }
    }
}

/// What the model wrote after an evaluation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sample {
    /// The version that wrote it.
    pub round: u64,
    pub prompt: String,
    pub text: String,
}

/// What a language model's run writes with: its vocabulary and the prompt, the first
/// tokens of the validation split (text the model has never trained on).
#[derive(Debug, Clone)]
pub(crate) struct Writer {
    pub vocabulary: Vocabulary,
    pub prompt: Vec<usize>,
}

/// Tokens of the prompt.
const PROMPT_TOKENS: usize = 16;

impl Writer {
    pub fn new(vocabulary: Vocabulary, test: &model::Dataset) -> Option<Self> {
        if test.is_empty() {
            return None;
        }
        let (x, _) = test.batch(0..1);
        let prompt = x
            .iter()
            .take(PROMPT_TOKENS.min(x.len() / 2).max(1))
            .map(|&id| id as usize)
            .collect();
        Some(Self { vocabulary, prompt })
    }

    /// What version `round` wrote.
    pub fn sample(&self, round: u64, ids: &[usize]) -> Sample {
        Sample {
            round,
            prompt: self.vocabulary.decode(&self.prompt),
            text: self.vocabulary.decode(ids),
        }
    }
}

/// Tokens the evaluation's sample holds at most, and at least.
const SAMPLE_TOKENS: (usize, usize) = (200, 24);
/// Floating-point operations one sample may cost (about 20 GFLOP: seconds on one core). A
/// token costs a forward pass over the context, `2 · parameters · context`.
const SAMPLE_FLOPS: f64 = 2e10;

/// How the sample after an evaluation is drawn for a model of `params` parameters and
/// `context` positions: temperature 0.8, top 20 (nanoGPT's `sample.py` draws at 0.8 and
/// 200), as many tokens as [`SAMPLE_FLOPS`] buys, and the version as the seed, so that one
/// version always writes the same text.
pub fn sampling(params: usize, context: usize, version: u64) -> Sampling {
    let per_token = 2.0 * params as f64 * context as f64;
    let tokens = (SAMPLE_FLOPS / per_token) as usize;
    Sampling {
        tokens: tokens.clamp(SAMPLE_TOKENS.1, SAMPLE_TOKENS.0),
        temperature: 0.8,
        top_k: 20,
        seed: version,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vocabulary_decodes_characters_and_bytes() {
        let chars = Vocabulary::new(vec![b"a".to_vec(), "é".as_bytes().to_vec()], "character");
        assert_eq!(chars.decode(&[1, 0, 7]), "éa\u{FFFD}");
        let bytes = Vocabulary::new((0..=255u8).map(|b| vec![b]).collect(), "byte");
        // "é" is two bytes: whole only when both are there.
        assert_eq!(bytes.decode(&[0xC3, 0xA9]), "é");
        assert_eq!(bytes.decode(&[0xC3]), "\u{FFFD}");
    }

    #[test]
    fn readings_of_a_loss() {
        let r = LossReadings::of(std::f64::consts::LN_2 * 2.0, "character");
        assert!((r.perplexity - 4.0).abs() < 1e-12);
        assert!((r.bits_per_token - 2.0).abs() < 1e-12);
    }

    #[test]
    fn a_bigger_model_writes_fewer_tokens() {
        assert_eq!(sampling(800_000, 64, 1).tokens, 195);
        assert_eq!(sampling(10_700_000, 256, 1).tokens, 24);
        assert_eq!(sampling(1000, 16, 1).tokens, 200);
    }
}
