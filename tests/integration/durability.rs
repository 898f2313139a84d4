use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;
use worker_core::WorkerCore;

use server::checkpoint::Store;

use crate::util::*;

const BIN: &str = env!("CARGO_BIN_EXE_coordinator");

/// The flags of a run that is bit-reproducible: sync, two workers (two f32 sums commute),
/// the plain mean, Adam, a fixed seed, and deadlines too long to ever close a round early.
const EXACT: [&str; 10] = [
    "--min-workers",
    "2",
    "--aggregator",
    "mean",
    "--optimizer",
    "adam",
    "--seed",
    "7",
    "--round-timeout",
    "60s",
];

/// Runs `cores` as native workers against `addr` until the coordinator closes them, and
/// gives the cores back (with their resume tokens).
async fn train_with(addr: std::net::SocketAddr, cores: Vec<WorkerCore>) -> Vec<WorkerCore> {
    let tasks: Vec<_> = cores
        .into_iter()
        .map(|mut core| {
            let options = worker::Options {
                url: ws_url(addr),
                ..worker::Options::default()
            };
            tokio::spawn(async move {
                let (ended, _) = worker::run_with(&options, &mut core, CancellationToken::new())
                    .await
                    .expect("worker runs");
                assert!(closed_by_shutdown(&ended), "{ended:?}");
                core
            })
        })
        .collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(
            guard("a worker to finish", task)
                .await
                .expect("worker task"),
        );
    }
    out
}

fn cores(n: usize) -> Vec<WorkerCore> {
    (0..n)
        .map(|_| worker::new_core(&worker::Options::default()))
        .collect()
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

fn state_json(checkpoint: &Path) -> serde_json::Value {
    let bytes = std::fs::read(checkpoint.join("state.json")).expect("state.json");
    serde_json::from_slice(&bytes).expect("json")
}

/// A sync run checkpointed at round 10, stopped, and resumed to round 20 (with Adam, whose
/// moments and step count must survive) ends with weights bit-identical to a run that never
/// stopped. The workers resume their identities, and the shard assignment is the saved one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_run_reaches_bit_identical_weights() {
    let _heavy = heavy().await;
    fn flags<'a>(extra: &[&'a str]) -> Vec<&'a str> {
        EXACT.iter().copied().chain(extra.iter().copied()).collect()
    }
    let straight = start_server(&flags(&["--max-rounds", "20"])).await;
    let weights = straight.weights.clone();
    let addr = straight.addr;
    let (summary, _) = tokio::join!(straight.wait(), train_with(addr, cores(2)));
    assert_eq!(summary.expect("clean").rounds, 20);
    let uninterrupted = snapshot_params(&weights.borrow());

    let dir = tempfile::tempdir().expect("temp dir");
    let ckpt = dir.path().to_str().expect("utf-8");
    let first = start_server(&flags(&[
        "--max-rounds",
        "10",
        "--checkpoint-dir",
        ckpt,
        "--checkpoint-every",
        "4",
    ]))
    .await;
    let (addr, mut status) = (first.addr, first.status.clone());
    let (summary, kept) = tokio::join!(first.wait(), train_with(addr, cores(2)));
    let summary = summary.expect("clean");
    assert_eq!((summary.rounds, summary.checkpoint_error), (10, None));
    let before = status.borrow_and_update().clone();
    let ids: BTreeSet<u32> = before.worker_list.iter().map(|w| w.id).collect();
    let saved = state_json(&dir.path().join("ckpt-000000000010"));
    assert!(dir.path().join("ckpt-000000000008").is_dir(), "every 4");
    let mlp = model::Network::mlp(&[784, 128, 10]).expect("valid");
    let at_10 = std::fs::read(dir.path().join("ckpt-000000000010/params.safetensors"));
    let (at_10, _) = server::tensors_file::decode_params(&at_10.expect("read"), mlp.layout())
        .expect("the checkpoint's parameters");

    let second = start_server(&flags(&[
        "--max-rounds",
        "20",
        "--checkpoint-dir",
        ckpt,
        "--checkpoint-every",
        "4",
        "--resume",
    ]))
    .await;
    let (addr, mut status, weights) = (second.addr, second.status.clone(), second.weights.clone());
    let resumed_at = status.borrow_and_update().round;
    assert_eq!(resumed_at, 10, "continues from the checkpoint");
    let (summary, _) = tokio::join!(second.wait(), train_with(addr, kept));
    assert_eq!(summary.expect("clean").rounds, 20);
    let after = status.borrow_and_update().clone();
    let resumed = snapshot_params(&weights.borrow());
    assert_eq!(
        bits(&resumed),
        bits(&uninterrupted),
        "bit-identical weights"
    );
    assert_ne!(
        bits(&resumed),
        bits(&at_10),
        "and training went on from there"
    );

    let ids_after: BTreeSet<u32> = after.worker_list.iter().map(|w| w.id).collect();
    assert_eq!(ids_after, ids, "the workers kept their ids");
    assert_eq!(
        after.counters.resumed,
        before.counters.resumed + 2,
        "both resumed with their tokens"
    );
    assert!(
        after.counters.gradients_accepted >= 40,
        "counters carried over: {after:?}"
    );
    let again = state_json(&dir.path().join("ckpt-000000000020"));
    assert_eq!(
        again["shards"], saved["shards"],
        "the same shard assignment"
    );
    println!(
        "resumed at {resumed_at}; ids {ids:?}; shards {}",
        saved["shards"]
    );
}

/// A native worker as the binary runs with `--reconnect`: one core (one identity) across
/// connections, retrying every 100 ms while the coordinator is away.
fn reconnecting_worker(url: String) -> (tokio::task::JoinHandle<u32>, CancellationToken) {
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let cancel = cancel.clone();
        async move {
            let options = worker::Options {
                url,
                ..worker::Options::default()
            };
            let mut core = worker::new_core(&options);
            let mut sessions = 0;
            while !cancel.is_cancelled() {
                let _ = worker::run_with(&options, &mut core, cancel.clone()).await;
                sessions += 1;
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                    () = cancel.cancelled() => {}
                }
            }
            sessions
        }
    });
    (task, cancel)
}

/// A number logged as `key=N` in `line`.
fn field(line: &str, key: &str) -> Option<u64> {
    let at = line.find(&format!(" {key}="))? + key.len() + 2;
    let digits: String = line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Reads log lines until `pred` holds for one, returning it.
async fn until_line(
    lines: &mut UnboundedReceiver<String>,
    what: &str,
    mut pred: impl FnMut(&str) -> bool,
) -> String {
    guard(what, async {
        loop {
            let line = lines.recv().await.expect("coordinator still running");
            if pred(&line) {
                return line;
            }
        }
    })
    .await
}

fn is_round(line: &str) -> Option<u64> {
    line.contains(": round ")
        .then(|| field(line, "round"))
        .flatten()
}

/// What a `kill -9` and a `--resume` came to (see [`kill_9_and_resume`]).
pub struct Resumed<W> {
    pub workers: W,
    pub addr: std::net::SocketAddr,
    pub child: tokio::process::Child,
    pub lines: UnboundedReceiver<String>,
    /// The status a few rounds before the kill.
    pub before: serde_json::Value,
    /// The last round the killed process logged, and its newest durable checkpoint.
    pub killed_at: u64,
    pub durable: u64,
    /// The version the new process resumed from.
    pub version: u64,
    _checkpoints: tempfile::TempDir,
}

/// Checkpoints every this many rounds in [`kill_9_and_resume`].
const EVERY: u64 = 5;

/// A real coordinator (`--min-workers 2`, checkpoints every [`EVERY`] rounds, every answer
/// recomputed) with the workers `start` puts on it, killed with SIGKILL past round 23 between
/// two checkpoints, and started again on the same port with `--resume`. The workers must come
/// back by themselves.
pub async fn kill_9_and_resume<W>(start: impl FnOnce(std::net::SocketAddr) -> W) -> Resumed<W> {
    let dir = tempfile::tempdir().expect("temp dir");
    let ckpt = dir.path().to_str().expect("utf-8");
    let every = EVERY.to_string();
    let flags = [
        "--min-workers",
        "2",
        "--checkpoint-dir",
        ckpt,
        "--checkpoint-every",
        &every,
        "--verify-fraction",
        "1",
    ];
    let (mut child, addr, mut lines) = spawn_coordinator_at(BIN.as_ref(), None, 0, &flags).await;
    let workers = start(addr);
    // The newest checkpoint the killed process said was written (durable: logged after its
    // rename and fsyncs).
    let mut durable = 0;
    let mut written = |l: &str| {
        if l.contains("checkpoint written") {
            durable = durable.max(field(l, "version").expect("version"));
        }
    };
    until_line(&mut lines, "a checkpoint", |l| {
        written(l);
        l.contains("checkpoint written")
    })
    .await;
    until_line(&mut lines, "round 20", |l| {
        written(l);
        is_round(l).is_some_and(|r| r >= 20)
    })
    .await;
    let before = get_status_json(addr).await;
    // Killed just after a round that follows a checkpoint, as far from the next one as can
    // be: the workers have computed batches past any checkpoint it can resume from.
    let line = until_line(&mut lines, "round 23", |l| {
        written(l);
        is_round(l).is_some_and(|r| r >= 23 && r % EVERY == 1)
    })
    .await;
    let seen = is_round(&line).expect("a round line");
    child.start_kill().expect("SIGKILL");
    child.wait().await.expect("killed");
    // The last round the killed process logged (its pipe is read to the end).
    let mut killed_at = seen.max(before["round"].as_u64().expect("round"));
    while let Some(line) = lines.recv().await {
        written(&line);
        killed_at = killed_at.max(is_round(&line).unwrap_or(0));
    }
    let resume: Vec<&str> = flags.iter().copied().chain(["--resume"]).collect();
    let (child, addr2, mut lines) =
        spawn_coordinator_at(BIN.as_ref(), None, addr.port(), &resume).await;
    assert_eq!(addr2, addr);
    let line = until_line(&mut lines, "the resume line", |l| {
        l.contains("resumed from a checkpoint")
    })
    .await;
    let version = field(&line, "version").expect("version");
    assert!(
        version < killed_at,
        "the workers had gone past the checkpoint: resumed from {version}, killed at {killed_at}"
    );
    Resumed {
        workers,
        addr,
        child,
        lines,
        before,
        killed_at,
        durable,
        version,
        _checkpoints: dir,
    }
}

impl<W> Resumed<W> {
    /// Trains 20 rounds past the round the killed process had reached (so past every batch
    /// its workers had computed), and checks that the coordinator recomputed the workers'
    /// answers all along and never found one that differs: no strike, no ban.
    pub async fn assert_nobody_struck(&mut self) -> serde_json::Value {
        let until = self.killed_at + 20;
        until_line(&mut self.lines, "20 rounds past the kill", |l| {
            is_round(l).is_some_and(|r| r >= until)
        })
        .await;
        let s = get_status_json(self.addr).await;
        assert_eq!(s["verification_mismatches"], 0, "{s}");
        assert_eq!(s["bans"], serde_json::json!([]), "{s}");
        let workers = s["worker_list"].as_array().expect("list");
        assert!(workers.iter().all(|w| w["strikes"] == 0), "{s}");
        // Answers were recomputed all along: at least one a round since the kill (the
        // counters resumed from the checkpoint's, which are at most those before the kill).
        let verified = s["gradients_verified"].as_u64().expect("count");
        let before = self.before["gradients_verified"].as_u64().expect("count");
        assert!(verified >= before + (until - self.killed_at), "{s}");
        println!(
            "resumed from {} after a kill at round {}: {verified} answers recomputed, none differed",
            self.version, self.killed_at
        );
        s
    }

    /// SIGTERM: a clean exit.
    pub async fn terminate(mut self) -> W {
        let pid = self.child.id().expect("running");
        let term = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("kill");
        assert!(term.success());
        let exit = guard("exit", self.child.wait()).await.expect("wait");
        assert!(exit.success(), "{exit}");
        self.workers
    }
}

/// kill -9 of a real coordinator mid-run, then `--resume` on the same port: it continues
/// from the newest checkpoint, the workers come back by themselves with their ids, accuracy
/// does not fall back, and the coordinator, recomputing every answer, strikes nobody
/// (the workers had computed batches past the checkpoint).
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_a_resumed_coordinator_continues_and_workers_come_back() {
    let _heavy = heavy().await;
    let mut run = kill_9_and_resume(|addr| {
        (0..2)
            .map(|_| reconnecting_worker(ws_url(addr)))
            .collect::<Vec<_>>()
    })
    .await;
    let ids = |s: &serde_json::Value| -> BTreeSet<u64> {
        s["worker_list"]
            .as_array()
            .expect("list")
            .iter()
            .map(|w| w["id"].as_u64().expect("id"))
            .collect()
    };
    let (ids_before, accuracy_before) = (ids(&run.before), run.before["test_accuracy"].as_f64());
    let (killed_at, durable, version) = (run.killed_at, run.durable, run.version);
    let lost = killed_at - version;
    println!(
        "killed at round {killed_at}, newest durable {durable}, resumed from {version}: {lost} rounds lost"
    );
    assert!(version.is_multiple_of(EVERY), "{version}");
    // It resumed from the newest durable checkpoint (or one durable a moment before the kill
    // without having logged it yet), never an older one.
    assert!(
        version >= durable && durable >= EVERY,
        "{version} < {durable}"
    );
    // A checkpoint is durable one write after it is due: `every` rounds, plus those applied
    // while the newest one was still being written. How many that is depends on the disk
    // and the machine's load, not on the coordinator (7-8 rounds in a debug build alone, 21
    // once with the whole suite beside it; docs/JOURNAL.md): it is printed, not bounded.
    // What is the coordinator's, resuming from the newest checkpoint it made durable, is
    // asserted above.
    until_line(&mut run.lines, "ten more rounds", |l| {
        is_round(l).is_some_and(|r| r >= version + 10)
    })
    .await;
    // Both listed under their old ids. On a loaded machine a worker can fall 8 frames behind
    // and be dropped as too slow; it then reconnects as itself, so wait for that, not for a
    // lucky instant. And an evaluation since the resume: the checkpoint resumed from may
    // have been taken before its round's evaluation landed (it runs beside training).
    let after = guard(
        "both workers back as themselves, and an evaluation",
        async {
            loop {
                let status = get_status_json(run.addr).await;
                if ids(&status) == ids_before && status["test_accuracy"].as_f64().is_some() {
                    return status;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        },
    )
    .await;
    assert!(after["resumed"].as_u64().expect("count") >= 2, "{after}");
    let accuracy_after = after["test_accuracy"].as_f64().expect("evaluated");
    println!("accuracy {accuracy_before:?} at the kill, {accuracy_after} ten rounds after");
    assert!(
        accuracy_after >= accuracy_before.expect("evaluated") - 0.02,
        "accuracy fell back"
    );
    run.assert_nobody_struck().await;
    for (task, cancel) in run.terminate().await {
        cancel.cancel();
        let sessions = guard("worker", task).await.expect("task");
        assert!(sessions >= 2, "it reconnected");
    }
}

/// `coordinator export` writes the newest checkpoint's parameters; the `safetensors` crate
/// reads them back equal to the run's final weights, and so does Python's `safetensors`
/// where it is installed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exported_model_loads_in_rust_and_python() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ckpt = dir.path().join("ckpt");
    let server = start_server(&[
        "--max-rounds",
        "12",
        "--checkpoint-dir",
        ckpt.to_str().expect("utf-8"),
    ])
    .await;
    let weights = server.weights.clone();
    let (task, _) = spawn_worker(server.addr);
    let summary = guard("12 rounds", server.wait()).await.expect("clean");
    let _ = guard("worker", task).await;
    assert_eq!((summary.rounds, summary.checkpoint_error), (12, None));
    let trained = snapshot_params(&weights.borrow());

    let out = dir.path().join("model.safetensors");
    let export = std::process::Command::new(BIN)
        .args(["export", "--checkpoint-dir"])
        .arg(&ckpt)
        .arg("--out")
        .arg(&out)
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&export.stdout);
    assert!(
        export.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&export.stderr)
    );
    assert!(stdout.contains("exported version 12"), "{stdout}");
    let bytes = std::fs::read(&out).expect("written");
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let mut flat = Vec::new();
    for name in ["l0.weight", "l0.bias", "l1.weight", "l1.bias"] {
        let t = file.tensor(name).expect(name);
        assert_eq!(t.dtype(), safetensors::Dtype::F32);
        flat.extend(
            t.data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
    }
    assert_eq!(file.tensor("l0.weight").expect("w").shape(), [784, 128]);
    assert_eq!(bits(&flat), bits(&trained), "the final weights, exactly");

    let script = r#"
import sys
from safetensors.numpy import load_file
t = load_file(sys.argv[1])
print(sorted((k, list(v.shape), str(v.dtype)) for k, v in t.items()))
print(float(sum(v.astype("float64").sum() for v in t.values())))
"#;
    let python = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&out)
        .output();
    match python {
        Ok(run) if run.status.success() => {
            let printed = String::from_utf8_lossy(&run.stdout);
            println!("python: {printed}");
            assert!(
                printed.contains("('l0.weight', [784, 128], 'float32')"),
                "{printed}"
            );
            let sum: f64 = printed
                .lines()
                .nth(1)
                .expect("sum")
                .parse()
                .expect("number");
            let expected: f64 = trained.iter().map(|&v| f64::from(v)).sum();
            assert!(
                (sum - expected).abs() < 1e-6 * expected.abs().max(1.0),
                "{sum} {expected}"
            );
        }
        Ok(run) => println!(
            "skipped the Python check (python3 without safetensors/numpy): {}",
            String::from_utf8_lossy(&run.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ),
        Err(e) => println!("skipped the Python check (no python3: {e})"),
    }
}

/// Async mode checkpoints by updates, and resumes at the version it stopped at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_runs_checkpoint_by_updates_and_resume() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ckpt = dir.path().to_str().expect("utf-8");
    let common = [
        "--mode",
        "async",
        "--checkpoint-dir",
        ckpt,
        "--checkpoint-every",
        "3",
    ];
    let run = |max: &'static str, resume: bool| {
        let mut flags: Vec<&str> = common.to_vec();
        flags.extend(["--max-rounds", max]);
        if resume {
            flags.push("--resume");
        }
        async move {
            let server = start_server(&flags).await;
            let start = server.status.borrow().round;
            let (task, _) = spawn_worker(server.addr);
            let summary = guard("the run", server.wait()).await.expect("clean");
            let _ = guard("worker", task).await;
            (start, summary)
        }
    };
    let (start, summary) = run("9", false).await;
    assert_eq!((start, summary.rounds), (0, 9));
    let versions: Vec<u64> = Store::new(dir.path().into(), 3, Default::default())
        .list()
        .expect("list")
        .into_iter()
        .map(|(v, _)| v)
        .collect();
    assert_eq!(versions, [9, 6, 3], "every 3 updates");
    let (start, summary) = run("15", true).await;
    assert_eq!((start, summary.rounds), (9, 15));
}
