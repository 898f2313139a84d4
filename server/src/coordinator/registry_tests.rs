//! Admission, resume, sending and shards, without a coordinator around them.

use model::Dataset;
use protocol::{decode_from_coordinator, Compression, ErrorCode, Hello, WorkerKind};
use tokio::sync::mpsc;

use std::net::IpAddr;

use super::*;

const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

fn t() -> Instant {
    Instant::now()
}

fn hello(join: Option<&str>, resume: Option<&str>) -> Hello {
    Hello {
        kind: Some(WorkerKind::Browser),
        join_token: join.map(str::to_owned),
        resume_token: resume.map(str::to_owned),
        compression: Compression::Int8,
    }
}

fn outbox(capacity: usize) -> (mpsc::Sender<Outbound>, mpsc::Receiver<Outbound>) {
    mpsc::channel(capacity)
}

#[test]
fn the_join_token_and_the_worker_limit_are_enforced() {
    let mut r = Registry::new(Some("secret".into()), 1, 3);
    let refused = r
        .admit(&hello(None, None), outbox(1).0, LOCAL, t())
        .expect_err("no token");
    assert_eq!(refused.code, ErrorCode::Unauthorized);
    let refused = r
        .admit(&hello(Some("guess"), None), outbox(1).0, LOCAL, t())
        .expect_err("wrong");
    assert_eq!(refused.code, ErrorCode::Unauthorized);
    let a = r
        .admit(&hello(Some("secret"), None), outbox(1).0, LOCAL, t())
        .expect("in");
    assert_eq!(
        (a.kind, a.resumed, a.replaced),
        (WorkerKind::Browser, false, false)
    );
    assert_eq!(r.compression(a.id), Some(Compression::Int8));
    let full = r
        .admit(&hello(Some("secret"), None), outbox(1).0, LOCAL, t())
        .expect_err("full");
    assert_eq!(full.code, ErrorCode::Full);
    assert!(full.message.contains("at most 1"), "{full}");
    // A resume is not a new worker: it gets in even when full.
    let back = r
        .admit(
            &hello(Some("secret"), Some(&a.token)),
            outbox(1).0,
            LOCAL,
            t(),
        )
        .expect("resumes");
    assert_eq!((back.id, back.resumed, back.replaced), (a.id, true, true));
}

#[test]
fn a_resume_replaces_the_live_session_and_keeps_the_gradient_count() {
    let mut r = Registry::new(None, 10, 3);
    let (tx, mut old_rx) = outbox(4);
    let a = r.admit(&hello(None, None), tx, LOCAL, t()).expect("in");
    r.note(a.id, Note::Accepted);
    r.note(a.id, Note::Accepted);
    let b = r
        .admit(&hello(None, Some(&a.token)), outbox(4).0, LOCAL, t())
        .expect("in");
    assert_eq!(b.id, a.id);
    assert_ne!(b.session, a.session);
    assert!(!r.is_current(a.id, a.session) && r.is_current(b.id, b.session));
    let Ok(Outbound::Close(refusal)) = old_rx.try_recv() else {
        panic!("the old session is told to close")
    };
    assert_eq!(refusal.code, ErrorCode::Replaced);
    // Leaves, comes back later: same id, count remembered.
    assert!(r.remove(b.id, t()));
    assert!(!r.remove(b.id, t()), "already gone");
    let c = r
        .admit(&hello(None, Some(&a.token)), outbox(4).0, LOCAL, t())
        .expect("in");
    assert_eq!((c.id, c.replaced), (a.id, false));
    assert_eq!(r.list(|_| false, Instant::now())[0].gradients, 2);
    // Unknown tokens are new identities; tokens are distinct.
    let d = r
        .admit(&hello(None, Some("not-a-token")), outbox(4).0, LOCAL, t())
        .expect("in");
    assert_ne!(d.id, a.id);
    assert_ne!(d.token, a.token);
}

#[test]
fn a_worker_that_does_not_read_is_marked_dropped() {
    let mut r = Registry::new(None, 10, 3);
    let (tx, _rx) = outbox(1);
    let a = r.admit(&hello(None, None), tx, LOCAL, t()).expect("in");
    r.send(a.id, Outbound::frame(bytes::Bytes::from_static(b"1")));
    assert!(!r.has_dropped());
    r.send(a.id, Outbound::frame(bytes::Bytes::from_static(b"2")));
    assert_eq!(r.next_dropped(), Some(a.id));
    // A closed outbox too.
    let (tx, rx) = outbox(1);
    let b = r.admit(&hello(None, None), tx, LOCAL, t()).expect("in");
    drop(rx);
    r.send_error(b.id, Refusal::new(ErrorCode::Late, "late"));
    assert_eq!(r.next_dropped(), Some(b.id));
}

#[test]
fn rebalance_sends_each_worker_its_shard_only_when_it_changes() {
    let mut r = Registry::new(None, 10, 3);
    let train = Dataset::new(2, (0..20).collect(), vec![0, 1, 0, 1, 0, 1, 0, 1, 0, 1]).expect("ok");
    let (tx, mut rx_a) = outbox(8);
    let a = r.admit(&hello(None, None), tx, LOCAL, t()).expect("in");
    r.rebalance(&train);
    let shard = |rx: &mut mpsc::Receiver<Outbound>| match rx.try_recv() {
        Ok(Outbound::Frames(f)) => match decode_from_coordinator(&f[0]).expect("frame") {
            CoordinatorToWorker::Shard(s) => match s.values {
                protocol::ShardValues::U8(v) => Some((s.first_index, s.labels.len(), v)),
                protocol::ShardValues::F32(_) => panic!("bytes stay bytes"),
            },
            other => panic!("{other:?}"),
        },
        _ => None,
    };
    assert_eq!(shard(&mut rx_a), Some((0, 10, (0..20).collect())));
    r.rebalance(&train);
    assert_eq!(shard(&mut rx_a), None, "unchanged: nothing sent");
    let (tx, mut rx_b) = outbox(8);
    let b = r.admit(&hello(None, None), tx, LOCAL, t()).expect("in");
    r.rebalance(&train);
    assert_eq!(shard(&mut rx_a).map(|s| (s.0, s.1)), Some((0, 5)));
    assert_eq!(shard(&mut rx_b).map(|s| (s.0, s.1)), Some((5, 5)));
    let list = r.list(|id| id == b.id, Instant::now());
    assert_eq!(
        list.iter()
            .map(|w| (w.id, w.shard_len, w.skipped))
            .collect::<Vec<_>>(),
        [(a.id.0, 5, false), (b.id.0, 5, true)]
    );
}

#[test]
fn strikes_ban_the_identity_and_its_address_but_never_loopback() {
    let remote: IpAddr = "203.0.113.5".parse().expect("ip");
    let mut r = Registry::new(None, 10, 2);
    let (tx, mut rx) = outbox(4);
    let a = r.admit(&hello(None, None), tx, remote, t()).expect("in");
    assert_eq!(r.strike(a.id), 1);
    assert!(r.bans().is_empty());
    assert_eq!(r.strike(a.id), 2);
    assert_eq!(r.bans(), [Banned::Worker(a.id), Banned::Address(remote)]);
    let Ok(Outbound::Close(refusal)) = rx.try_recv() else {
        panic!("the banned session is closed")
    };
    assert_eq!(refusal.code, ErrorCode::Banned);
    r.remove(a.id, t());
    // Neither the identity nor the address gets back in.
    let again = r.admit(&hello(None, Some(&a.token)), outbox(4).0, LOCAL, t());
    assert_eq!(again.expect_err("banned identity").code, ErrorCode::Banned);
    let fresh = r.admit(&hello(None, None), outbox(4).0, remote, t());
    assert_eq!(fresh.expect_err("banned address").code, ErrorCode::Banned);
    // Bad input from an address: banned at the second; loopback never.
    let other: IpAddr = "198.51.100.7".parse().expect("ip");
    r.strike_address(other);
    assert!(r.admit(&hello(None, None), outbox(4).0, other, t()).is_ok());
    r.strike_address(other);
    assert!(r
        .admit(&hello(None, None), outbox(4).0, other, t())
        .is_err());
    for _ in 0..10 {
        r.strike_address(LOCAL);
    }
    assert!(r.admit(&hello(None, None), outbox(4).0, LOCAL, t()).is_ok());
    assert_eq!(r.bans().last(), Some(&Banned::Address(other)));
}

#[test]
fn an_answer_is_checked_against_the_shard_held_when_the_weights_were_sent() {
    let mut r = Registry::new(None, 10, 3);
    let train = Dataset::new(2, (0..20).collect(), vec![0, 1, 0, 1, 0, 1, 0, 1, 0, 1]).expect("ok");
    let a = r
        .admit(&hello(None, None), outbox(8).0, LOCAL, t())
        .expect("in");
    let shard = |r: &Registry| r.pull(a.id).map(|p| p.shard.clone());
    assert_eq!(r.pulled(a.id, 0, t()), Some(0));
    assert_eq!(shard(&r), None, "no shard yet: nothing to compute on");
    r.rebalance(&train);
    r.pulled(a.id, 1, t());
    assert_eq!(shard(&r), Some(0..10));
    // A newcomer mid-round re-cuts the shards; `a` is still computing on its old one.
    let _b = r
        .admit(&hello(None, None), outbox(8).0, LOCAL, t())
        .expect("in");
    r.rebalance(&train);
    assert_eq!(shard(&r), Some(0..10));
    r.pulled(a.id, 2, t());
    assert_eq!(shard(&r), Some(0..5));
}

#[test]
fn the_batch_of_a_pull_is_its_version_and_never_repeats_on_one_identity() {
    let mut r = Registry::new(None, 10, 3);
    let train = Dataset::new(2, (0..20).collect(), vec![0, 1, 0, 1, 0, 1, 0, 1, 0, 1]).expect("ok");
    let a = r
        .admit(&hello(None, None), outbox(8).0, LOCAL, t())
        .expect("in");
    r.rebalance(&train);
    let pull = |r: &mut Registry, version| {
        r.pulled(a.id, version, t());
        let p = r.pull(a.id).expect("a pull");
        (p.version, p.batch)
    };
    assert_eq!(pull(&mut r, 4), (4, 4));
    // The same version again (async before the buffer applies, a refused update): the next
    // batches, however many times.
    assert_eq!(pull(&mut r, 4), (4, 5));
    assert_eq!(pull(&mut r, 4), (4, 6));
    assert_eq!(pull(&mut r, 9), (9, 9));
    // Resumed while its old connection is still open: the identity goes on where it was.
    let b = r
        .admit(&hello(None, Some(&a.token)), outbox(8).0, LOCAL, t())
        .expect("resumed");
    assert_eq!((b.id, b.replaced), (a.id, true));
    r.rebalance(&train);
    assert_eq!(pull(&mut r, 9), (9, 10));
    // Gone and back: the coordinator starts it again from the version it is sent.
    r.remove(a.id, t());
    r.admit(&hello(None, Some(&a.token)), outbox(8).0, LOCAL, t())
        .expect("resumed");
    r.rebalance(&train);
    assert_eq!(pull(&mut r, 9), (9, 9));
}

#[test]
fn replicate_gives_groups_of_one_compression_the_same_shard() {
    let mut r = Registry::new(None, 10, 3).with_replicate(2);
    let train = Dataset::new(2, (0..40).collect(), vec![0; 20]).expect("ok");
    let mut ids = Vec::new();
    // Three exact-f32 workers and two int8 ones, admitted interleaved.
    for compression in [
        Compression::None,
        Compression::Int8,
        Compression::None,
        Compression::Int8,
        Compression::None,
    ] {
        let (tx, rx) = outbox(8);
        let hello = Hello {
            compression,
            ..hello(None, None)
        };
        ids.push((r.admit(&hello, tx, LOCAL, t()).expect("in").id, rx));
    }
    r.rebalance(&train);
    for (id, _) in &ids {
        r.pulled(*id, 0, t());
    }
    let group = |i: usize| r.replica_group(ids[i].0);
    // f32: workers 0 and 2 share a shard; 4 is alone (no partner). int8: 1 and 3.
    let (a, b) = (group(0).expect("paired"), group(2).expect("paired"));
    assert_eq!(a, b);
    assert_eq!(a.1, 2);
    assert_eq!(group(1), group(3));
    assert_ne!(group(1).expect("paired").0, a.0, "another shard");
    assert_eq!(group(4), None);
    // Three groups cut the split in three.
    let shards: std::collections::BTreeSet<_> = ids
        .iter()
        .filter_map(|(id, _)| Some(r.pull(*id)?.shard.clone()))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|s| (s.start, s.end))
        .collect();
    assert_eq!(shards.len(), 3, "{shards:?}");
}
