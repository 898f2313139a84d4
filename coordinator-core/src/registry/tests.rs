//! Admission, resume, bans and shards, without a coordinator around them.

use std::net::IpAddr;

use model::Dataset;
use protocol::{
    decode_from_coordinator, Compression, CoordinatorToWorker, ErrorCode, Hello, WorkerKind,
};

use super::*;
use crate::session::Outbound;

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
        fused: false,
    }
}

/// What a worker's `Hello` said sets the order its work is replayed in first, and the
/// worker table says whether it fuses.
#[test]
fn a_tab_that_says_it_fuses_is_replayed_fused() {
    let mut r = Registry::new(None, 4, 3);
    let admit = |r: &mut Registry, kind, fused| {
        let hello = Hello {
            kind: Some(kind),
            fused,
            ..hello(None, None)
        };
        r.admit(&hello, LOCAL, t()).expect("in").id
    };
    let fused = admit(&mut r, WorkerKind::Browser, true);
    let unfused = admit(&mut r, WorkerKind::Browser, false);
    let native = admit(&mut r, WorkerKind::Native, false);
    assert_eq!(r.order(fused), Some(model::Order::Fused));
    assert_eq!(r.order(unfused), Some(model::Order::Unfused));
    assert_eq!(r.order(native), Some(model::Order::Library));
    let table = r.list(|_| false, |_| None, t());
    let said: Vec<bool> = table.iter().map(|w| w.fused).collect();
    assert_eq!(said, [true, false, false]);
}

#[test]
fn the_join_token_and_the_worker_limit_are_enforced() {
    let mut r = Registry::new(Some("secret".into()), 1, 3);
    let refused = r
        .admit(&hello(None, None), LOCAL, t())
        .expect_err("no token");
    assert_eq!(refused.code, ErrorCode::Unauthorized);
    let refused = r
        .admit(&hello(Some("guess"), None), LOCAL, t())
        .expect_err("wrong");
    assert_eq!(refused.code, ErrorCode::Unauthorized);
    let a = r
        .admit(&hello(Some("secret"), None), LOCAL, t())
        .expect("in");
    assert_eq!(
        (a.kind, a.resumed, a.replaced),
        (WorkerKind::Browser, false, None)
    );
    assert_eq!(r.compression(a.id), Some(Compression::Int8));
    let full = r
        .admit(&hello(Some("secret"), None), LOCAL, t())
        .expect_err("full");
    assert_eq!(full.code, ErrorCode::Full);
    assert!(full.message.contains("at most 1"), "{full}");
    // A resume is not a new worker: it gets in even when full.
    let back = r
        .admit(&hello(Some("secret"), Some(&a.token)), LOCAL, t())
        .expect("resumes");
    assert_eq!(
        (back.id, back.resumed, back.replaced),
        (a.id, true, Some(a.session))
    );
}

#[test]
fn a_resume_replaces_the_live_session_and_keeps_the_gradient_count() {
    let mut r = Registry::new(None, 10, 3);
    let a = r.admit(&hello(None, None), LOCAL, t()).expect("in");
    r.note(a.id, Note::Accepted);
    r.note(a.id, Note::Accepted);
    let b = r
        .admit(&hello(None, Some(&a.token)), LOCAL, t())
        .expect("in");
    assert_eq!(b.id, a.id);
    assert_ne!(b.session, a.session);
    assert!(!r.is_current(a.id, a.session) && r.is_current(b.id, b.session));
    assert_eq!(
        b.replaced,
        Some(a.session),
        "the old session is to be closed"
    );
    assert_eq!(r.session(a.id), Some(b.session));
    // Leaves, comes back later: same id, count remembered.
    assert!(r.remove(b.id, t()));
    assert!(!r.remove(b.id, t()), "already gone");
    let c = r
        .admit(&hello(None, Some(&a.token)), LOCAL, t())
        .expect("in");
    assert_eq!((c.id, c.replaced), (a.id, None));
    assert_eq!(r.list(|_| false, |_| None, Instant::now())[0].gradients, 2);
    // Unknown tokens are new identities; tokens are distinct.
    let d = r
        .admit(&hello(None, Some("not-a-token")), LOCAL, t())
        .expect("in");
    assert_ne!(d.id, a.id);
    assert_ne!(d.token, a.token);
}

#[test]
fn a_worker_dropped_by_the_driver_is_removed_once() {
    let mut r = Registry::new(None, 10, 3);
    let a = r.admit(&hello(None, None), LOCAL, t()).expect("in");
    assert!(!r.has_dropped());
    r.drop_worker(a.id);
    assert_eq!(r.next_dropped(), Some(a.id));
    assert!(r.remove(a.id, t()));
    assert_eq!(r.session(a.id), None);
}

#[test]
fn rebalance_sends_each_worker_its_shard_only_when_it_changes() {
    let mut r = Registry::new(None, 10, 3);
    let train = Dataset::new(2, (0..20).collect(), vec![0, 1, 0, 1, 0, 1, 0, 1, 0, 1]).expect("ok");
    let a = r.admit(&hello(None, None), LOCAL, t()).expect("in");
    // Each message's worker, first index, length and pixels.
    type Cut = (WorkerId, (u32, usize, Vec<u8>));
    let shards = |messages: Vec<(WorkerId, Outbound)>| -> Vec<Cut> {
        messages
            .into_iter()
            .map(|(id, m)| {
                let frame = m.frames().next().expect("one frame").clone();
                match decode_from_coordinator(&frame).expect("frame") {
                    CoordinatorToWorker::Shard(s) => match s.values {
                        protocol::ShardValues::U8(v) => (id, (s.first_index, s.labels.len(), v)),
                        protocol::ShardValues::F32(_) => panic!("bytes stay bytes"),
                    },
                    other => panic!("{other:?}"),
                }
            })
            .collect()
    };
    assert_eq!(
        shards(r.rebalance(&train)),
        [(a.id, (0, 10, (0..20).collect()))]
    );
    assert!(r.rebalance(&train).is_empty(), "unchanged: nothing sent");
    let b = r.admit(&hello(None, None), LOCAL, t()).expect("in");
    let cut: Vec<_> = shards(r.rebalance(&train))
        .into_iter()
        .map(|(id, s)| (id, s.0, s.1))
        .collect();
    assert_eq!(cut, [(a.id, 0, 5), (b.id, 5, 5)]);
    let list = r.list(|id| id == b.id, |_| None, Instant::now());
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
    let a = r.admit(&hello(None, None), remote, t()).expect("in");
    assert_eq!(r.strike(a.id), (1, false));
    assert!(r.bans().is_empty());
    assert_eq!(
        r.strike(a.id),
        (2, true),
        "banned: its session is to be closed"
    );
    assert_eq!(r.bans(), [Banned::Worker(a.id), Banned::Address(remote)]);
    assert!(!r.ban(a.id), "banned once");
    r.remove(a.id, t());
    // Neither the identity nor the address gets back in.
    let again = r.admit(&hello(None, Some(&a.token)), LOCAL, t());
    assert_eq!(again.expect_err("banned identity").code, ErrorCode::Banned);
    let fresh = r.admit(&hello(None, None), remote, t());
    assert_eq!(fresh.expect_err("banned address").code, ErrorCode::Banned);
    // Bad input from an address: banned at the second; loopback never.
    let other: IpAddr = "198.51.100.7".parse().expect("ip");
    r.strike_address(other);
    assert!(r.admit(&hello(None, None), other, t()).is_ok());
    r.strike_address(other);
    assert!(r.admit(&hello(None, None), other, t()).is_err());
    for _ in 0..10 {
        r.strike_address(LOCAL);
    }
    assert!(r.admit(&hello(None, None), LOCAL, t()).is_ok());
    assert_eq!(r.bans().last(), Some(&Banned::Address(other)));
}

#[test]
fn an_answer_is_checked_against_the_shard_held_when_the_weights_were_sent() {
    let mut r = Registry::new(None, 10, 3);
    let train = Dataset::new(2, (0..20).collect(), vec![0, 1, 0, 1, 0, 1, 0, 1, 0, 1]).expect("ok");
    let a = r.admit(&hello(None, None), LOCAL, t()).expect("in");
    let shard = |r: &Registry| r.pull(a.id).map(|p| p.shard.clone());
    assert_eq!(r.pulled(a.id, 0, None, t()), Some(0));
    assert_eq!(shard(&r), None, "no shard yet: nothing to compute on");
    r.rebalance(&train);
    r.pulled(a.id, 1, None, t());
    assert_eq!(shard(&r), Some(0..10));
    // A newcomer mid-round re-cuts the shards; `a` is still computing on its old one.
    let _b = r.admit(&hello(None, None), LOCAL, t()).expect("in");
    r.rebalance(&train);
    assert_eq!(shard(&r), Some(0..10));
    r.pulled(a.id, 2, None, t());
    assert_eq!(shard(&r), Some(0..5));
}

#[test]
fn the_batch_of_a_pull_is_its_version_and_never_repeats_on_one_identity() {
    let mut r = Registry::new(None, 10, 3);
    let train = Dataset::new(2, (0..20).collect(), vec![0, 1, 0, 1, 0, 1, 0, 1, 0, 1]).expect("ok");
    let a = r.admit(&hello(None, None), LOCAL, t()).expect("in");
    r.rebalance(&train);
    let pull = |r: &mut Registry, version| {
        r.pulled(a.id, version, None, t());
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
        .admit(&hello(None, Some(&a.token)), LOCAL, t())
        .expect("resumed");
    assert_eq!((b.id, b.replaced.is_some()), (a.id, true));
    r.rebalance(&train);
    assert_eq!(pull(&mut r, 9), (9, 10));
    // Gone and back: the coordinator starts it again from the version it is sent.
    r.remove(a.id, t());
    r.admit(&hello(None, Some(&a.token)), LOCAL, t())
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
        let hello = Hello {
            compression,
            ..hello(None, None)
        };
        ids.push((r.admit(&hello, LOCAL, t()).expect("in").id, ()));
    }
    r.rebalance(&train);
    for (id, _) in &ids {
        r.pulled(*id, 0, None, t());
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
