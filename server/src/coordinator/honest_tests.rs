//! Honest workers are never struck: the real coordinator and real [`WorkerCore`]s, every frame
//! through the codec and the session's own checks, time passed in, at `--verify-fraction 1`
//! (every answer recomputed), through the paths where the coordinator could recompute on
//! other weights, another batch or another shard than the worker was given: a resume from a
//! checkpoint older than the workers, the same weights pulled many times (async), a plain
//! reconnect with a token, the operator's new weights and learning rate, and shards re-cut
//! while answers are pending.

use super::test_swarm::Swarm;
use coordinator_core::{Command, Status};

/// A swarm of `n` whose every answer is recomputed.
fn verified(flags: &[&str], n: usize) -> Swarm {
    let mut all = vec!["--verify-fraction", "1"];
    all.extend_from_slice(flags);
    Swarm::new(&all, n)
}

/// Every answer accepted since the start (at least `min` of them) was recomputed first and
/// matched; nobody was struck or banned.
fn assert_never_struck(s: &Status, min: u64) {
    assert_eq!(s.counters.verification_mismatches, 0, "{s:?}");
    assert!(
        s.counters.gradients_accepted >= min,
        "{} accepted: {s:?}",
        s.counters.gradients_accepted
    );
    assert!(
        s.counters.gradients_verified >= s.counters.gradients_accepted,
        "{s:?}"
    );
    assert!(s.bans.is_empty(), "{s:?}");
    assert!(s.worker_list.iter().all(|w| w.strikes == 0), "{s:?}");
}

#[test]
fn a_resume_from_a_checkpoint_older_than_the_workers_strikes_nobody() {
    let mut swarm = verified(&["--min-workers", "2"], 2);
    swarm.until("round 10", |s| s.round >= 10);
    let checkpoint = swarm.checkpoint();
    assert_eq!(checkpoint.version, 10);
    // The workers go on well past the checkpoint: their batches run ahead of it.
    swarm.until("round 40", |s| s.round >= 40);
    swarm.restart_from(checkpoint);
    assert_eq!(swarm.round(), 10);
    let s = swarm.until("40 rounds after the resume", |s| s.round >= 50);
    assert_eq!(s.counters.resumed, 2, "both came back as themselves");
    assert_never_struck(&s, 2 * 39);
}

#[test]
fn the_same_weights_pulled_many_times_are_checked_on_the_batch_each_was_given() {
    // One worker and a buffer of 4: it answers the same version 4 times before it changes.
    let mut swarm = verified(&["--mode", "async", "--buffer", "4"], 1);
    let s = swarm.until("40 updates", |s| s.round >= 40);
    assert_never_struck(&s, 160);
    // Three workers of one version, and hogwild.
    let mut swarm = verified(&["--mode", "async", "--buffer", "5"], 3);
    assert_never_struck(&swarm.until("20 updates", |s| s.round >= 20), 100);
    let mut swarm = verified(&["--mode", "hogwild"], 2);
    assert_never_struck(&swarm.until("60 updates", |s| s.round >= 60), 60);
}

#[test]
fn a_worker_back_with_its_token_mid_round_is_checked_on_what_it_was_given() {
    let mut swarm = verified(&["--min-workers", "2", "--round-timeout", "60s"], 3);
    swarm.until("round 3", |s| s.round >= 3);
    for _ in 0..10 {
        // Worker 0 has its weights and computed its answer; the connection drops before
        // the answer goes up, and it comes back with its token within the round.
        let round = swarm.round();
        swarm.deliver(0);
        swarm.disconnect(0);
        swarm.connect(0);
        swarm.until("the next round", |s| s.round > round);
        // Now it drops with its answer half uploaded and its next weights unread.
        swarm.deliver(0);
        let half = swarm.volunteers[0].outgoing.len() / 2;
        swarm.volunteers[0].outgoing.truncate(half);
        swarm.upload(0);
        swarm.disconnect(0);
        swarm.connect(0);
        swarm.step();
    }
    let s = swarm.until("round 40", |s| s.round >= 40);
    assert_eq!(s.counters.resumed, 20);
    assert_never_struck(&s, 3 * 30);
}

#[test]
fn new_weights_and_learning_rates_from_the_operator_mid_round_strike_nobody() {
    for mode in [&["--min-workers", "2"][..], &["--mode", "async"][..]] {
        let mut swarm = verified(mode, 3);
        swarm.until("round 5", |s| s.round >= 5);
        let fresh = swarm.c.net().init(99);
        for k in 0..6u32 {
            // Weights out, answers computed, not uploaded yet: the operator acts.
            for i in 0..3 {
                swarm.deliver(i);
            }
            if k % 2 == 0 {
                let patch = (0..fresh.len(), fresh.clone());
                swarm.admin(Command::ReplaceParams(vec![patch]));
            } else {
                swarm.admin(Command::SetLr(0.0005 * k as f32));
            }
            swarm.step();
            let round = swarm.round();
            swarm.until("two more updates", |s| s.round >= round + 2);
        }
        let s = swarm.until("round 40", |s| s.round >= 40);
        assert_never_struck(&s, 40);
    }
}

#[test]
fn shards_re_cut_while_answers_are_pending_strike_nobody() {
    for mode in [
        &["--min-workers", "2", "--round-timeout", "60s"][..],
        &["--mode", "async"][..],
    ] {
        let mut swarm = verified(mode, 2);
        swarm.until("round 3", |s| s.round >= 3);
        for _ in 0..8 {
            // Everyone holds weights it has not read; a newcomer (async) or the next round
            // (sync) re-cuts the shards, and the new shards queue behind the weights.
            let newcomer = swarm.add();
            for i in 0..swarm.volunteers.len() {
                swarm.deliver(i);
            }
            swarm.step();
            let round = swarm.round();
            swarm.until("an update with the newcomer", |s| s.round >= round + 2);
            // And one leaves with answers pending elsewhere.
            for i in 0..swarm.volunteers.len() {
                swarm.deliver(i);
            }
            swarm.disconnect(newcomer);
            swarm.step();
        }
        let s = swarm.until("round 40", |s| s.round >= 40);
        assert_never_struck(&s, 60);
    }
}
