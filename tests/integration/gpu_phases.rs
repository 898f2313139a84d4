//! A GPU's local phases, checked by segments over the real protocol: tabs computing a GPT's
//! phases on WebGPU (SwiftShader here) behind home links, committed, challenged, revealed
//! and replayed; and clients that compute "on a GPU" (natively, in another float order)
//! and cheat, banned.

use std::time::Duration;

use futures_util::StreamExt;
use model::Order;
use protocol::{decode_from_worker, encode_gradient, Compression, Gradient, WorkerToCoordinator};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;
use worker_core::Compute;

use crate::util::*;

/// A small GPT's phases of 8 steps, committed every 4, every answer checked.
const PHASES: [&str; 8] = [
    "--local-steps",
    "8",
    "--segment-steps",
    "4",
    "--verify-fraction",
    "1",
    "--min-workers",
    "2",
];

/// Two tabs on the GPU path (`?gpu=fallback`), each behind its own home link (25 ms and
/// 10 Mbit/s each way), train a small GPT with local phases computed on their GPUs: every
/// phase committed, challenged (two segments and the last state revealed) and replayed by
/// segments, none struck, while the validation loss falls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gpu_tabs_behind_home_links_train_a_gpt_checked_by_segments() {
    let _heavy = heavy().await;
    let mut flags = crate::language::SMALL_GPT.to_vec();
    flags.extend(PHASES);
    flags.extend(["--eval-interval", "2"]);
    gpu_tabs_train(&flags, 8, 20).await;
}

/// The same with the 0.8M GPT (nanoGPT's CPU shape: 4 blocks, width 128, context 64) over a
/// longer run: 8-step phases committed every 4, every one checked, 12 rounds after the
/// first evaluation (about 30 s a round here: each challenge reveals two states of 9.7 MB
/// over a 10 Mbit/s link). Batches of 2 windows, as SwiftShader computes on the same two
/// cores as everything else (a batch of 12 takes it 5 s alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark, not a test: bench/long-runs.sh gpu-tabs-0.8m"]
async fn two_gpu_tabs_behind_home_links_train_the_08m_gpt_checked_by_segments() {
    let _heavy = heavy().await;
    let mut flags = vec![
        "--model",
        "gpt",
        "--batch-size",
        "2",
        "--eval-interval",
        "2",
    ];
    flags.extend(PHASES);
    gpu_tabs_train(&flags, 12, 24).await;
}

/// The same with the `cnn` preset (ReLUs and max-pools): each step's near-tie branches,
/// read from the GPU's activations, logged and hashed with each committed state, forced
/// where the coordinator's replay finds them near too. Batches of 8 images.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gpu_tabs_behind_home_links_train_the_cnn_checked_by_segments() {
    let _heavy = heavy().await;
    let mut flags = vec![
        "--model",
        "cnn",
        "--batch-size",
        "8",
        "--eval-interval",
        "2",
    ];
    flags.extend(PHASES);
    let s = gpu_tabs_train(&flags, 6, 12).await;
    // Their logs came with the revealed states (hashed with them) and were replayed.
    assert!(s.counters.branches_logged > 0, "{s:?}");
}

/// Two GPU tabs behind home links on a coordinator with `flags`, for `rounds` rounds after
/// the first evaluation and at least `checked` phases checked: every answer the GPU's,
/// none a mismatch, nobody struck, the loss lower. The status at the end.
async fn gpu_tabs_train(flags: &[&str], rounds: u64, checked: u64) -> server::Status {
    let _ = tracing_subscriber::fmt().with_env_filter("warn").try_init();
    let server = start_server(flags).await;
    let mut status = server.status.clone();
    let cancel = CancellationToken::new();
    let mut tabs = Vec::new();
    for _ in 0..2 {
        let addr = slowlink::proxy(server.addr, crate::links::home(), cancel.clone())
            .await
            .expect("proxy");
        let tab =
            crate::browser::Browser::open_with_devtools(&format!("http://{addr}/?gpu=fallback"));
        tab.until(
            "the page to compute on the GPU",
            "document.getElementById('device').dataset.device === 'gpu'",
        )
        .await;
        tabs.push(tab);
    }
    let first = round_by_round(&mut status, "a first evaluation", |s| s.test_loss.is_some()).await;
    let started = std::time::Instant::now();
    let s = round_by_round(&mut status, "phases from the tabs' GPUs, checked", |s| {
        s.evaluated_round >= first.evaluated_round.map(|r| r + rounds)
            && s.counters.gradients_verified >= checked
            && s.worker_list.len() == 2
    })
    .await;
    let (before, after) = (
        first.test_loss.expect("evaluated"),
        s.test_loss.expect("evaluated"),
    );
    println!(
        "two GPU tabs behind home links: validation loss {before:.3} at round {:?}, {after:.3} \
         at round {:?} ({:.0} s); {} phases checked by segments, {} mismatches, {} logged \
         branches ({} forced); per tab (cores, answers, verified, strikes, samples/s): {:?}",
        first.evaluated_round,
        s.evaluated_round,
        started.elapsed().as_secs_f64(),
        s.counters.gradients_verified,
        s.counters.verification_mismatches,
        s.counters.branches_logged,
        s.counters.branches_forced,
        s.worker_list
            .iter()
            .map(|w| (
                w.cores,
                w.gradients,
                w.verified,
                w.strikes,
                w.samples_per_sec
            ))
            .collect::<Vec<_>>()
    );
    // Every answer in the GPU's own order (`cores` 0): phases committed and challenged.
    assert!(s.worker_list.iter().all(|w| w.cores == 0), "{s:?}");
    assert!(after < before - 0.05, "the loss falls: {before} to {after}");
    assert_eq!(s.counters.verification_mismatches, 0, "{s:?}");
    assert!(s.worker_list.iter().all(|w| w.strikes == 0), "{s:?}");
    assert!(s.bans.is_empty(), "{s:?}");
    for tab in tabs {
        tab.close().await;
    }
    cancel.cancel();
    stop(server).await;
    s
}

/// Waits for `pred` one round at a time (each round within the guard: a round of the 0.8M
/// model on SwiftShader, its phases and their reveals, takes about 25 s here).
async fn round_by_round(
    status: &mut tokio::sync::watch::Receiver<server::Status>,
    what: &str,
    mut pred: impl FnMut(&server::Status) -> bool,
) -> server::Status {
    loop {
        let now = status.borrow().clone();
        if pred(&now) {
            return now;
        }
        let next = format!("{what}: the round after {}", now.round);
        wait_status(status, &next, |s| s.round > now.round || pred(s)).await;
    }
}

/// How a client that computes "on its GPU" cheats.
#[derive(Debug, Clone, Copy, PartialEq)]
enum GpuCheat {
    /// None: an honest GPU.
    Honest,
    /// Honest phases and commitments; the answer ×1.01.
    ScaledAnswer,
    /// One step of each phase not taken (its gradient zero), committed as if it were.
    SkippedStep,
    /// Each step's products on weights rounded to f16.
    Fp16,
    /// A ReLU model's honest steps whose logs also name a unit it does not have.
    ForgedLog,
}

/// A client that takes its phases "on a GPU" (the real worker core, each step computed
/// natively in another float order than the coordinator's) and cheats as `cheat` says,
/// answering challenges with what it committed to. Runs until the coordinator closes it.
fn spawn_gpu_cheat(
    addr: std::net::SocketAddr,
    cheat: GpuCheat,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut w = ManualWorker::join(addr).await;
        w.core.set_compute(Compute::Unordered);
        let mut step = 0u32;
        loop {
            let frame = tokio::select! {
                () = stop.cancelled() => return,
                f = w.client.ws.next() => match f {
                    Some(Ok(Message::Binary(frame))) => frame,
                    Some(Ok(_)) => continue,
                    _ => return,
                },
            };
            let Ok(mut replies) = w.core.handle_frame(&frame) else {
                return;
            };
            while w.core.working() {
                let Ok(frames) = w.core.work() else { return };
                replies.extend(frames);
                let Some(job) = w.core.job() else { continue };
                let computed = gpu_step(&job, cheat);
                // A ReLU model's committed step: the branches of its own forward pass.
                let log = w.core.logs_branches().then(|| {
                    let log = model::with_order(Order::Unfused, || {
                        job.net.branches(&job.weights, job.x, job.seed)
                    });
                    let mut log = log.unwrap_or_default();
                    if cheat == GpuCheat::ForgedLog {
                        let nobody = model::Branch {
                            layer: 1,
                            row: u32::MAX,
                            col: 0,
                            taken: 1,
                        };
                        log.push(nobody);
                    }
                    log
                });
                drop(job);
                let Ok((loss, mut grads)) = computed else {
                    return;
                };
                if cheat == GpuCheat::SkippedStep && step % 8 == 3 {
                    grads.iter_mut().for_each(|g| *g = 0.0);
                }
                step += 1;
                let completed = match &log {
                    Some(log) => w.core.complete_logged(loss, grads, log),
                    None => w.core.complete(loss, grads),
                };
                let Ok(frames) = completed else {
                    return;
                };
                replies.extend(frames);
            }
            if cheat == GpuCheat::ScaledAnswer {
                replies = scaled(replies);
            }
            if !replies.is_empty() {
                w.send(replies).await;
            }
        }
    })
}

/// One step's gradient as `cheat`'s "GPU" computes it: in the other CPU order, on weights
/// rounded to f16 for `Fp16`.
fn gpu_step(
    job: &worker_core::Job<'_>,
    cheat: GpuCheat,
) -> Result<(f32, Vec<f32>), model::ModelError> {
    let weights: Vec<f32> = match cheat {
        GpuCheat::Fp16 => {
            let mut bytes = Vec::new();
            protocol::tensor::encode_payload(&mut bytes, &job.weights, Compression::F16);
            protocol::tensor::decode_payload(&bytes, job.weights.len(), Compression::F16)
        }
        _ => job.weights.to_vec(),
    };
    model::with_order(Order::Unfused, || {
        job.net.loss_and_grad(&weights, job.x, job.labels, job.seed)
    })
}

/// The frames with any gradient's values ×1.01 (its commitments as they were).
fn scaled(frames: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut answer: Option<Gradient> = None;
    for frame in frames {
        let Ok(WorkerToCoordinator::Gradient(chunk)) = decode_from_worker(&frame) else {
            out.push(frame);
            continue;
        };
        let g = answer.get_or_insert(Gradient {
            round: chunk.round,
            samples: chunk.samples,
            loss: chunk.loss,
            compute_us: chunk.compute_us,
            parts: chunk.parts,
            grads: Vec::new(),
        });
        g.grads.extend(chunk.grads.iter().map(|v| v * 1.01));
        if g.grads.len() == chunk.total as usize {
            out.extend(encode_gradient(
                &answer.take().expect("whole"),
                Compression::None,
            ));
        }
    }
    out
}

/// A client taking a ReLU model's phases "on its GPU" whose logs name a unit the model
/// does not have, beside an honest one logging its own: the forger is banned at its third
/// strike (each a mismatch naming the log), the honest one never struck, its logs replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_branch_log_is_banned_and_an_honest_one_replayed() {
    let _heavy = heavy().await;
    let mut flags = PHASES.to_vec();
    flags.extend(["--model", "cnn", "--max-rounds", "200", "--batch-size", "4"]);
    let mut swarm = swarm(&flags, 1).await;
    let stop = CancellationToken::new();
    let honest = spawn_gpu_cheat(swarm.addr(), GpuCheat::Honest, stop.clone());
    let forger = spawn_gpu_cheat(swarm.addr(), GpuCheat::ForgedLog, stop.clone());
    let s = swarm.wait_for("the ban", |s| !s.bans.is_empty()).await;
    assert_eq!(
        s.counters.verification_mismatches, 3,
        "three strikes: {s:?}"
    );
    let s = swarm
        .wait_for("the honest workers verified", |s| {
            s.worker_list.len() == 2 && s.worker_list.iter().all(|w| w.verified > 1)
        })
        .await;
    println!(
        "a forged log: banned ({:?}); {} verified, {} mismatches, {} branches logged",
        s.bans,
        s.counters.gradients_verified,
        s.counters.verification_mismatches,
        s.counters.branches_logged
    );
    assert!(s.worker_list.iter().all(|w| w.strikes == 0), "{s:?}");
    assert!(
        s.counters.branches_logged > 0,
        "the honest GPU's logs: {s:?}"
    );
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), forger).await;
    let _ = tokio::time::timeout(Duration::from_secs(10), honest).await;
    swarm.stop().await;
}

/// Each cheat on a GPU's phases joins two honest native workers (their phases in the
/// coordinator's order, replayed whole) and an honest client computing "on its GPU" the
/// same way: the cheat is banned at its third strike, and no honest worker is struck, the
/// GPU's phases each checked by segments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cheats_on_a_gpus_committed_phases_are_banned() {
    let _heavy = heavy().await;
    for cheat in [
        GpuCheat::ScaledAnswer,
        GpuCheat::SkippedStep,
        GpuCheat::Fp16,
    ] {
        let mut flags = crate::language::SMALL_GPT.to_vec();
        flags.extend(PHASES);
        flags.extend(["--max-rounds", "200"]);
        let mut swarm = swarm(&flags, 2).await;
        let stop = CancellationToken::new();
        let honest = spawn_gpu_cheat(swarm.addr(), GpuCheat::Honest, stop.clone());
        let attacker = spawn_gpu_cheat(swarm.addr(), cheat, stop.clone());
        let s = swarm.wait_for("the ban", |s| !s.bans.is_empty()).await;
        println!(
            "{cheat:?}: banned at round {} ({:?}); {} verified, {} mismatches",
            s.round, s.bans, s.counters.gradients_verified, s.counters.verification_mismatches
        );
        assert_eq!(
            s.counters.verification_mismatches, 3,
            "three strikes: {s:?}"
        );
        let s = swarm
            .wait_for("the three honest workers verified", |s| {
                s.worker_list.len() == 3 && s.worker_list.iter().all(|w| w.verified > 1)
            })
            .await;
        assert!(s.worker_list.iter().all(|w| w.strikes == 0), "{s:?}");
        assert_eq!(
            s.worker_list.iter().filter(|w| w.cores == 0).count(),
            1,
            "the honest GPU's answers in its own order: {s:?}"
        );
        stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), attacker).await;
        let _ = tokio::time::timeout(Duration::from_secs(10), honest).await;
        swarm.stop().await;
    }
}
