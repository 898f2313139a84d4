//! `coordinator sample`: text from the newest valid checkpoint of a GPT. The checkpoint
//! holds the weights and the run's tokeniser (as nanoGPT's `meta.pkl` does); one written
//! before tokenisers were kept needs it rebuilt from the run's corpus (`--data`,
//! `--tokenizer`), and the tokeniser must have the model's vocabulary size.

use std::path::{Path, PathBuf};

use model::gpt::Sampling;
use model::ParamLayout;

use super::export::{gpt_of, saved_tokenizer};
use super::format::PARAMS;
use super::{CheckpointError, Store};
use crate::dataset::{Tokenizer, TokenizerKind};

/// What was written, and from which checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub version: u64,
    pub from: PathBuf,
    /// The prompt, then what the model added.
    pub prompt: String,
    pub text: String,
}

/// The newest intact checkpoint in `dir` continues `prompt` as `how` says, tokenised with
/// the checkpoint's own tokeniser, or, when either `data` or `kind` is given, as `kind`
/// (`char` if not given) tokenises the corpus at `data` (the embedded Shakespeare if not).
pub fn sample(
    dir: &Path,
    data: Option<&Path>,
    kind: Option<&TokenizerKind>,
    prompt: &str,
    how: Sampling,
) -> Result<Sampled, CheckpointError> {
    let store = Store::new(dir.to_path_buf(), usize::MAX, ParamLayout::default());
    let (from, intact, _) = store.newest_intact()?;
    let fail = |reason: String| CheckpointError::Export {
        path: from.clone(),
        reason,
    };
    let net = gpt_of(&intact)
        .map_err(fail)?
        .ok_or_else(|| fail("not a language model: only a gpt writes text".into()))?;
    let tokenizer = if data.is_none() && kind.is_none() {
        saved_tokenizer(&intact, &from)
            .map_err(fail)?
            .ok_or_else(|| {
                fail("it does not keep its tokeniser (written by an older coordinator): give the run's --data and --tokenizer".into())
            })?
    } else {
        let (text, _) = crate::dataset::text::read(data).map_err(|e| fail(e.to_string()))?;
        Tokenizer::fit(kind.unwrap_or(&TokenizerKind::Char), &text).map_err(fail)?
    };
    tokenizer
        .fits(net.classes())
        .map_err(|e| fail(format!("{e}: give the run's --data and --tokenizer")))?;
    let ids: Vec<usize> = tokenizer
        .encode(prompt)
        .map_err(|e| fail(format!("the prompt: {e}")))?
        .into_iter()
        .map(|i| i as usize)
        .collect();
    let (params, _) =
        crate::storage::tensors_file::decode_params(&intact.files[PARAMS], net.layout())
            .map_err(|e| fail(e.to_string()))?;
    let drawn = net
        .generate(&params, &ids, how)
        .ok_or_else(|| fail("not a language model: only a gpt writes text".into()))?
        .map_err(|e| fail(e.to_string()))?;
    Ok(Sampled {
        version: intact.version,
        from,
        prompt: prompt.to_string(),
        text: tokenizer.decode(&drawn),
    })
}
