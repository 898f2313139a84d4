//! The bar a crowd must beat: PyTorch on this whole machine, timed for real in the same
//! invocation, before the crowd's runs and with nothing beside it. The repository's
//! `scripts/parity/gpt_torch_train.py` trains the same 0.8M GPT (Hugging Face's GPT-2 code,
//! nanoGPT's recipe: AdamW, warm-up then cosine, batch 12) on the same corpus and split and
//! scores the same validation windows; its time to the target is the training time until
//! the first evaluation at or under it, evaluations left out (the crowd's cost nothing in
//! virtual time either).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use serde_json::Value;

/// The 0.8M GPT the script trains: the crowd must train the same for the comparison.
pub const PARAMETERS: usize = 810_880;

/// PyTorch's run.
#[derive(Debug)]
pub struct Torch {
    /// Training seconds until an evaluation reached the target, if one did.
    pub reached: Option<f64>,
    /// Steps until then (or all of them).
    pub steps: u64,
    /// The last evaluation's validation loss.
    pub loss: f64,
    pub threads: usize,
}

/// The script, from the workspace's root.
fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/parity/gpt_torch_train.py")
}

/// Trains with `python` on `threads` threads, evaluating every `every` steps, until an
/// evaluation reaches `target` or `steps` are done.
pub fn run(
    python: &Path,
    threads: usize,
    every: u32,
    steps: u32,
    target: f64,
) -> anyhow::Result<Torch> {
    let mut child = Command::new(python)
        .arg(script())
        .args(["--threads", &threads.to_string()])
        .args(["--eval-every", &every.to_string()])
        .args(["--steps", &steps.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("--torch: starting {}", python.display()))?;
    let stdout = child.stdout.take().context("--torch: no stdout")?;
    let torch = read(BufReader::new(stdout), threads, target)?;
    if torch.reached.is_some() {
        // The rest of its schedule is not needed.
        let _ = child.kill();
    }
    let status = child.wait().context("--torch: waiting for the script")?;
    if torch.reached.is_none() && !status.success() {
        bail!("--torch: {} exited with {status}", script().display());
    }
    if torch.steps == 0 {
        bail!(
            "--torch: the script printed no evaluation (is torch installed for {}?)",
            python.display()
        );
    }
    Ok(torch)
}

/// The script's evaluations, up to the first at or under `target`.
fn read(out: impl BufRead, threads: usize, target: f64) -> anyhow::Result<Torch> {
    let mut torch = Torch {
        reached: None,
        steps: 0,
        loss: f64::NAN,
        threads,
    };
    for line in out.lines() {
        let line = line.context("--torch: reading the script's output")?;
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let (Some(step), Some(loss), Some(seconds)) = (
            v["step"].as_u64(),
            v["val_loss"].as_f64(),
            v["train_seconds"].as_f64(),
        ) else {
            continue;
        };
        torch.steps = step;
        torch.loss = loss;
        if loss <= target {
            torch.reached = Some(seconds);
            break;
        }
    }
    Ok(torch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_time_is_the_first_evaluation_at_the_target_without_the_evaluations() {
        let out = "[transformers] a warning\n\
            {\"step\": 25, \"train_loss\": 3.1, \"val_loss\": 3.0, \"seconds\": 1.0, \"train_seconds\": 0.9}\n\
            {\"step\": 50, \"train_loss\": 2.1, \"val_loss\": 1.99, \"seconds\": 2.2, \"train_seconds\": 1.95}\n\
            {\"step\": 75, \"train_loss\": 2.0, \"val_loss\": 1.9, \"seconds\": 3.3, \"train_seconds\": 2.9}\n";
        let t = read(out.as_bytes(), 2, 2.0).expect("read");
        assert_eq!((t.reached, t.steps, t.loss), (Some(1.95), 50, 1.99));
        let t = read(out.as_bytes(), 2, 1.5).expect("read");
        assert_eq!((t.reached, t.steps, t.loss), (None, 75, 1.9));
    }
}
