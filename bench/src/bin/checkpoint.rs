//! `checkpoint`: what a checkpoint costs, for the default model and a 1M-parameter one.
//!
//! For each model: the copy the coordinator makes between two events (parameters and Adam's
//! two moments), the write on the writer's thread (encode, CRC-32, write, fsync, rename,
//! fsync of the directory), reading it back with every check, and its size. Medians of
//! `--repeats`. Prints one JSON object per model.

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use model::{Network, OptimizerKind};
use server::checkpoint::{Checkpoint, Fingerprint, RunState, Store};

#[derive(Debug, Parser)]
struct Cli {
    /// Where to write (the disk checkpoints would go to) [default: the system temp dir].
    #[arg(long)]
    dir: Option<PathBuf>,
    #[arg(long, default_value_t = 7)]
    repeats: usize,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let base = cli.dir.unwrap_or_else(std::env::temp_dir);
    for (name, layers) in [
        ("default 784-128-10", vec![784, 128, 10]),
        ("1M 784-1262-10", vec![784, 1262, 10]),
    ] {
        let mlp = Network::mlp(&layers)?;
        let params = mlp.init(1);
        let p = params.len();
        let mut adam = OptimizerKind::Adam {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
        .build(p);
        let grad: Vec<f32> = (0..p).map(|i| (i % 17) as f32 * 1e-3).collect();
        let mut trained = params.clone();
        adam.step(&mut trained, &grad);
        let fingerprint = Fingerprint {
            model: name.into(),
            param_count: p,
            dataset: "bench".into(),
            optimizer: "adam".into(),
            mode: "sync".into(),
        };
        let dir = base.join(format!("crowdtrain-bench-ckpt-{}", std::process::id()));
        let store = Store::new(dir.clone(), 3, mlp.layout().clone());
        store.probe()?;
        let (mut copy, mut write, mut read) = (Vec::new(), Vec::new(), Vec::new());
        let mut bytes = 0;
        for version in 1..=cli.repeats as u64 {
            let t = Instant::now();
            let checkpoint = Checkpoint {
                params: trained.clone(),
                optimizer: adam.state(),
                run: RunState {
                    version,
                    fingerprint: fingerprint.clone(),
                    written_unix_ms: 0,
                    audit_rng: 1,
                    next_worker: 5,
                    identities: (1..=4u32).map(|i| (format!("{i}.{i:032x}"), 10)).collect(),
                    shards: vec![
                        (1, 0, 2000),
                        (2, 2000, 4000),
                        (3, 4000, 6000),
                        (4, 6000, 8000),
                    ],
                    deadline_latencies_ns: vec![10_000_000; 256],
                    norm_history: vec![1.0; 64],
                    counters: Default::default(),
                    bans: Default::default(),
                    evaluation: None,
                    tokenizer: None,
                },
            };
            copy.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            bytes = store.write(&checkpoint)?.bytes;
            write.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            let loaded = store.load_newest(&fingerprint, &["m".into(), "v".into()])?;
            read.push(t.elapsed().as_secs_f64() * 1e3);
            anyhow::ensure!(loaded.checkpoint == checkpoint, "read back differs");
        }
        std::fs::remove_dir_all(&dir)?;
        println!(
            "{}",
            serde_json::json!({
                "model": name,
                "params": p,
                "checkpoint_bytes": bytes,
                "copy_ms": median(copy),
                "write_ms": median(write),
                "read_and_verify_ms": median(read),
                "repeats": cli.repeats,
                "dir": base.display().to_string(),
            })
        );
    }
    Ok(())
}
