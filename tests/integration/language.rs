//! A language model end to end: a small GPT on the embedded Shakespeare, trained by native
//! workers over real sockets with every answer replayed, checkpointed, exported by the real
//! binary as a Hugging Face directory, and read back by `--init`; what it writes on the
//! status and from a checkpoint (`coordinator sample`).

use server::storage::hf;

use crate::util::*;

const BIN: &str = env!("CARGO_BIN_EXE_coordinator");

/// A GPT small enough for the suite: 1 block, 2 heads, width 32, context 16 (about 19,000
/// parameters with the corpus's 73 characters).
pub const SMALL_GPT: [&str; 10] = [
    "--model",
    "gpt",
    "--gpt-layers",
    "1",
    "--gpt-heads",
    "2",
    "--gpt-width",
    "32",
    "--context",
    "16",
];

/// The repository's byte-level BPE for the embedded text (512 tokens).
const BPE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../data/shakespeare-bpe/tokenizer.json"
);

/// `coordinator export` of the newest checkpoint in `ckpt` to `out`, with `extra` flags.
fn export(ckpt: &std::path::Path, out: &std::path::Path, extra: &[&str]) -> std::process::Output {
    std::process::Command::new(BIN)
        .args(["export", "--checkpoint-dir"])
        .arg(ckpt)
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .expect("runs")
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpt_trains_on_text_verified_and_goes_to_hugging_face_and_back() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ckpt = dir.path().join("ckpt");
    let mut flags = SMALL_GPT.to_vec();
    flags.extend([
        "--min-workers",
        "2",
        "--batch-size",
        "16",
        "--max-rounds",
        "150",
        // A short run: a short warm-up, and no decay (the floor is the rate).
        "--warmup",
        "10",
        "--min-lr",
        "0.001",
        "--verify-fraction",
        "1",
        "--checkpoint-dir",
        ckpt.to_str().expect("utf-8"),
    ]);
    let swarm = swarm(&flags, 2).await;
    let weights = swarm.server.weights.clone();
    let status = swarm.status.clone();
    let (summary, workers) = swarm.finish("150 rounds of a GPT").await;
    for task in workers {
        let _ = guard("worker", task).await;
    }
    let s = status.borrow().clone();
    assert_never_flagged("gpt", &s, summary.rounds, 2, 150);
    // From ln 73 = 4.29 nats a character at the start.
    let loss = summary.test_loss.expect("evaluated");
    println!(
        "validation loss after 150 rounds: {loss:.3}, next-character accuracy {:?}",
        summary.test_accuracy
    );
    assert!(loss < 3.3, "validation loss {loss}");
    // The status reads a language model's loss, and shows what it wrote.
    let language = s.language.expect("a language model's readings");
    let evaluated = s.test_loss.expect("evaluated");
    assert_eq!(language.unit, "character");
    assert!((language.bits_per_token - evaluated / std::f64::consts::LN_2).abs() < 1e-9);
    assert!((language.perplexity - evaluated.exp()).abs() < 1e-9);
    let sample = s.sample.expect("a sample after an evaluation");
    println!(
        "round {}: {:?} -> {:?}",
        sample.round, sample.prompt, sample.text
    );
    assert!(
        sample.round >= 10 && sample.round % 10 == 0,
        "{}",
        sample.round
    );
    assert_eq!(sample.prompt.chars().count(), 8, "half the 16-token window");
    assert!(sample.text.chars().count() >= 24, "{:?}", sample.text);
    let trained = snapshot_params(&weights.borrow());

    // The real binary exports the checkpoint as a Hugging Face directory.
    let out = dir.path().join("hf");
    let exported = export(&ckpt, &out, &[]);
    assert!(
        exported.status.success(),
        "{}",
        String::from_utf8_lossy(&exported.stderr)
    );
    let (spec, params) = hf::read_dir(&out).expect("a GPT-2 directory");
    // A tokeniser that is not the run's is refused before anything is written.
    let wrong = export(&ckpt, &dir.path().join("hf-wrong"), &["--tokenizer", BPE]);
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        !wrong.status.success() && stderr.contains("512 tokens, the model 73"),
        "{stderr}"
    );
    assert!(!dir.path().join("hf-wrong").exists());

    // `coordinator sample` continues a prompt from the checkpoint; the same seed writes the
    // same text, and a tokeniser that is not the run's is refused.
    let sample = |extra: &[&str]| {
        std::process::Command::new(BIN)
            .args(["sample", "--checkpoint-dir"])
            .arg(&ckpt)
            .args(["--prompt", "ROMEO:", "--tokens", "40"])
            .args(extra)
            .output()
            .expect("runs")
    };
    let written = sample(&[]);
    let text = String::from_utf8_lossy(&written.stdout).into_owned();
    assert!(
        written.status.success(),
        "{}",
        String::from_utf8_lossy(&written.stderr)
    );
    println!("coordinator sample: {text:?}");
    assert!(
        text.starts_with("ROMEO:") && text.trim_end().chars().count() > 20,
        "{text:?}"
    );
    assert_eq!(String::from_utf8_lossy(&sample(&[]).stdout), text, "seeded");
    // The checkpoint keeps the run's tokeniser: rebuilding it from the corpus is the same.
    let rebuilt = sample(&["--tokenizer", "char"]);
    assert_eq!(
        String::from_utf8_lossy(&rebuilt.stdout),
        text,
        "the same tokeniser"
    );
    let bytes = sample(&["--tokenizer", "byte"]);
    let stderr = String::from_utf8_lossy(&bytes.stderr);
    assert!(
        !bytes.status.success() && stderr.contains("256 tokens, the model 73"),
        "{stderr}"
    );
    assert_eq!(
        (
            spec.vocab,
            spec.context,
            spec.layers,
            spec.heads,
            spec.width
        ),
        (73, 16, 1, 2, 32)
    );
    assert_eq!(bits(&params), bits(&trained), "the final weights, exactly");

    // `--init DIR` starts a run from them; a directory of another shape is refused by name.
    let mut again = SMALL_GPT.to_vec();
    again.extend(["--init", out.to_str().expect("utf-8")]);
    let server = start_server(&again).await;
    assert_eq!(
        bits(&snapshot_params(&server.weights.borrow())),
        bits(&trained)
    );
    stop(server).await;
    let mut wider = SMALL_GPT.to_vec();
    wider[7] = "64";
    wider.extend(["--init", out.to_str().expect("utf-8")]);
    let refused = std::process::Command::new(BIN)
        .args(&wider)
        .args(["--port", "0"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("its model is"),
        "{stderr}"
    );
}

/// A GPT on local phases as DiLoCo trains one: AdamW inside each phase (its decay on the
/// blocks' matrices), Nesterov outside. Every phase is replayed by the coordinator and none
/// is flagged; the validation loss falls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpt_trains_on_local_adamw_phases_every_one_replayed() {
    let mut flags = SMALL_GPT.to_vec();
    flags.extend([
        "--min-workers",
        "2",
        "--batch-size",
        "8",
        "--local-steps",
        "8",
        "--max-rounds",
        "25",
        "--eval-interval",
        "5",
        "--verify-fraction",
        "1",
    ]);
    let swarm = swarm(&flags, 2).await;
    let status = swarm.status.clone();
    let (summary, workers) = swarm.finish("25 rounds of AdamW phases").await;
    for task in workers {
        let _ = guard("worker", task).await;
    }
    let s = status.borrow().clone();
    assert!(s.optimizer.contains("Nesterov"), "{}", s.optimizer);
    assert_never_flagged("gpt phases", &s, summary.rounds, 2, 25);
    let loss = summary.test_loss.expect("evaluated");
    println!("validation loss after 25 rounds of 8 AdamW steps: {loss:.3}");
    assert!(loss < 3.6, "from ln 73 = 4.29: {loss}");
}

/// `--tokenizer FILE`: the repository's byte-level BPE (`data/shakespeare-bpe`, a Hugging
/// Face `tokenizer.json`) tokenises on the coordinator; a native worker trains on its ids,
/// every answer replayed; the status reads the loss per token and the sample is text; the
/// export carries the tokeniser beside the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpt_trains_on_a_hugging_face_bpe_tokenizer() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ckpt = dir.path().join("ckpt");
    let mut flags = SMALL_GPT.to_vec();
    flags.extend([
        "--checkpoint-dir",
        ckpt.to_str().expect("utf-8"),
        "--tokenizer",
        BPE,
        "--batch-size",
        "16",
        "--max-rounds",
        "40",
        "--warmup",
        "10",
        "--verify-fraction",
        "1",
    ]);
    let swarm = swarm(&flags, 1).await;
    let status = swarm.status.clone();
    let (summary, workers) = swarm.finish("40 rounds of a GPT on BPE tokens").await;
    for task in workers {
        let _ = guard("worker", task).await;
    }
    let s = status.borrow().clone();
    assert_never_flagged("gpt on bpe", &s, summary.rounds, 1, 40);
    assert_eq!(s.classes.len(), 512, "the tokeniser's vocabulary");
    let loss = summary.test_loss.expect("evaluated");
    // From ln 512 = 6.24 nats a token at the start.
    assert!(loss < 6.0, "validation loss {loss}");
    let language = s.language.expect("a language model's readings");
    assert_eq!(language.unit, "token");
    let sample = s.sample.expect("a sample after an evaluation");
    println!(
        "bpe: loss {loss:.3}; {:?} -> {:?}",
        sample.prompt, sample.text
    );
    assert!(!sample.text.is_empty() && !sample.prompt.is_empty());
    // The checkpoint keeps the tokenizer.json: export writes it beside the model, whether
    // it is given again or not, and sample reads with it.
    for (name, given) in [("hf", &["--tokenizer", BPE][..]), ("hf-kept", &[][..])] {
        let out = dir.path().join(name);
        let exported = export(&ckpt, &out, given);
        assert!(
            exported.status.success(),
            "{}",
            String::from_utf8_lossy(&exported.stderr)
        );
        assert_eq!(
            std::fs::read(out.join("tokenizer.json")).expect("written"),
            std::fs::read(BPE).expect("the repository's"),
            "{name}"
        );
        assert_eq!(hf::read_dir(&out).expect("a GPT-2 directory").0.vocab, 512);
    }
    let written = std::process::Command::new(BIN)
        .args(["sample", "--checkpoint-dir"])
        .arg(&ckpt)
        .args(["--prompt", "ROMEO:", "--tokens", "20"])
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&written.stdout);
    assert!(
        written.status.success() && text.starts_with("ROMEO:") && text.len() > 20,
        "{text:?} {}",
        String::from_utf8_lossy(&written.stderr)
    );
}
