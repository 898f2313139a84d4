//! The simulator's own checks, and the coordinator's behaviour under conditions a real
//! machine cannot make quickly: slow links, stragglers, churn and attacks, in virtual time.

use std::time::Duration;

use coordinator_core::{Data, Mode, Settings};
use model::{NetSpec, Network};
use protocol::Compression;

use crate::*;

pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The embedded digits, split as the server splits them with seed 42.
pub(crate) fn mnist() -> Data {
    static DIGITS: std::sync::OnceLock<model::Dataset> = std::sync::OnceLock::new();
    let all = DIGITS.get_or_init(|| model::digits::embedded().expect("the embedded digits"));
    let (train, test) = all.clone().shuffled_split(42 ^ 0x5EED_DA7A, 8_000);
    Data {
        train,
        test,
        classes: (0..10).map(|c| c.to_string()).collect(),
        description: "embedded MNIST".into(),
        vocabulary: None,
    }
}

/// `hidden` units, on the digits.
pub(crate) fn scenario(hidden: usize, workers: Vec<WorkerSpec>, settings: Settings) -> Scenario {
    let data = mnist();
    let net = Network::new(NetSpec::mlp(data.train.shape(), &[hidden], 10), 10).expect("model");
    scenario_of(net, data, workers, settings)
}

/// `net` on `data`, seed 7, evaluations of 50 ms, recomputation free.
pub(crate) fn scenario_of(
    net: Network,
    data: Data,
    workers: Vec<WorkerSpec>,
    settings: Settings,
) -> Scenario {
    Scenario {
        settings,
        net,
        data,
        workers,
        seed: 7,
        until: Until::default(),
        evaluation_time: ms(50),
        recompute_step: Duration::ZERO,
    }
}

pub(crate) fn sync(min_workers: usize) -> Settings {
    Settings {
        min_workers,
        audit_seed: Some(11),
        eval_interval: 25,
        ..Settings::default()
    }
}

pub(crate) fn honest(n: usize, link: Link, step: Duration) -> Vec<WorkerSpec> {
    (0..n)
        .map(|_| WorkerSpec::new(link, step).with_compression(Compression::Int8))
        .collect()
}

#[test]
fn the_same_scenario_gives_the_same_run_to_the_bit() {
    let mut link = Link::symmetric(ms(40), 20.0);
    link.down.jitter = ms(15);
    link.up.jitter = ms(15);
    let make = || {
        let settings = Settings {
            verify_fraction: 0.5,
            ..sync(3)
        };
        let mut workers = honest(3, link, ms(3));
        workers.push(
            WorkerSpec::new(link, ms(3))
                .behaving(Behaviour::Scaled(1.01))
                .joining_at(ms(500)),
        );
        let mut s = scenario(16, workers, settings);
        s.until.rounds = Some(60);
        s
    };
    let (a, b) = (run(make()), run(make()));
    assert_eq!(a, b);
    assert_eq!(a.rounds, 60);
    assert!(
        a.verification_mismatches >= 1,
        "the cheat was caught: {a:?}"
    );
    // Another seed draws other jitter: another run.
    let mut other = make();
    other.seed = 8;
    assert_ne!(run(other).seconds, a.seconds);
}

#[test]
fn a_link_costs_what_its_latency_and_bandwidth_say() {
    // One worker, one round, nothing overlapping: its Hello goes up; the Welcome, its shard
    // (all 8,000 training digits: 6.3 MB), the Task and the weights come down; 2 ms of
    // compute; the gradient goes up. Three one-way latencies, every byte at 10 Mbit/s.
    let link = Link::symmetric(ms(50), 10.0);
    // Whole weights each version: the next pull's, in int8, are the gradient's size.
    let settings = Settings {
        weight_deltas: None,
        ..sync(1)
    };
    let mut s = scenario(128, honest(1, link, ms(2)), settings);
    s.until.rounds = Some(1);
    let r = run(s);
    assert_eq!(r.rounds, 1);
    // The next round's pull also went down, after the update: the size of the gradient
    // that went up, so the bytes down stand for both.
    let w = &r.workers[0];
    let expected = 3.0 * 0.025 + 0.002 + w.bytes_down as f64 * 8.0 / 10e6;
    assert!(
        (r.seconds - expected).abs() < 1e-3,
        "{} s, expected {expected} for {} bytes down and {} up",
        r.seconds,
        w.bytes_down,
        w.bytes_up
    );
    assert!(w.bytes_down > 6_272_000, "the shard went down: {w:?}");
}

#[test]
fn per_step_sync_on_a_home_link_leaves_the_workers_idle_and_on_loopback_it_does_not() {
    let run_on = |link: Link| {
        let mut s = scenario(128, honest(4, link, ms(2)), sync(4));
        s.until.rounds = Some(100);
        run(s)
    };
    let home = run_on(Link::symmetric(ms(50), 10.0));
    let loopback = run_on(Link::LOOPBACK);
    assert!(home.mean_compute_share < 0.02, "{home:?}");
    assert!(loopback.mean_compute_share > 0.9, "{loopback:?}");
    assert!(home.samples_per_sec * 20.0 < loopback.samples_per_sec);
    // Same rounds, same bytes: the link changes the time, not the work.
    assert_eq!(home.samples, loopback.samples);
    assert!((home.bytes_per_sample / loopback.bytes_per_sample - 1.0).abs() < 0.01);
}

#[test]
fn four_workers_train_the_digits_and_a_straggler_is_left_behind() {
    let link = Link::symmetric(ms(10), 100.0);
    let mut workers = honest(3, link, ms(2));
    // A straggler taking 2 s a gradient, against a 200 ms deadline: rounds close without it,
    // and after three misses it is skipped, answering when it can. (With the adaptive
    // deadline a straggler that is a quarter of the answers sets the pace: 1.5 × their
    // 90th percentile is its time.)
    workers.push(WorkerSpec::new(link, Duration::from_secs(2)));
    let settings = Settings {
        mode: Mode::Sync {
            timeout: coordinator_core::schedule::deadline::RoundTimeout::Fixed(ms(200)),
            miss_limit: 3,
        },
        ..sync(3)
    };
    let mut s = scenario(32, workers, settings);
    s.until = Until {
        time: Duration::from_secs(120),
        accuracy: Some(0.9),
        rounds: None,
    };
    let r = run(s);
    let at = r
        .seconds_to_target
        .unwrap_or_else(|| panic!("reached 90 %: {r:?}"));
    assert!(at < 60.0, "{r:?}");
    assert!(r.accuracy.expect("evaluated") >= 0.9);
    let straggler = &r.workers[3];
    assert!(
        straggler.gradients_sent * 4 < r.workers[0].gradients_sent,
        "{r:?}"
    );
}

#[test]
fn churn_costs_rounds_not_the_run() {
    let link = Link::symmetric(ms(20), 50.0);
    let mut workers = honest(4, link, ms(3));
    workers[0] = workers[0].clone().with_churn(ms(300), Churn::Leave);
    workers[1] = workers[1]
        .clone()
        .with_churn(ms(400), Churn::Reconnect)
        .with_churn(ms(900), Churn::Reconnect);
    workers[2] = workers[2]
        .clone()
        .with_churn(ms(600), Churn::Freeze(Duration::from_secs(3)));
    workers.push(
        WorkerSpec::new(link, ms(3))
            .with_compression(Compression::Int8)
            .joining_at(ms(1200)),
    );
    let mut s = scenario(32, workers, sync(2));
    s.until.rounds = Some(300);
    let r = run(s);
    assert_eq!(r.rounds, 300, "{r:?}");
    assert_eq!(r.workers[0].ended.as_deref(), Some("left"));
    assert_eq!(r.workers[1].sessions, 3, "came back twice as itself");
    assert!(r.workers[4].gradients_sent > 0, "the late joiner took part");
    assert_eq!((r.verification_mismatches, r.bans), (0, 0));
}

#[test]
fn one_hostile_worker_in_five_costs_little_and_cheats_are_banned() {
    let settings = Settings {
        verify_fraction: 0.2,
        ..sync(4)
    };
    one_hostile_in_five(settings, ms(2), 300, 0.85);
}

/// Four honest workers and a fifth that is, in turn, each attack (×(−10), noise, zeros,
/// ×1.01, another batch), on a 10 ms, 100 Mbit/s link, `rounds` rounds of `settings`: a clean
/// run reaches `clean_at_least`, each attack costs at most 2 points against it, and each is
/// caught and banned (the identity and its address); honest workers never are.
pub(crate) fn one_hostile_in_five(
    settings: Settings,
    step: Duration,
    rounds: u64,
    clean_at_least: f64,
) {
    let build = |workers| scenario(32, workers, settings.clone());
    let (clean, attacked) = hostile_in_five(build, step, rounds);
    let clean_accuracy = clean.accuracy.expect("evaluated");
    assert!(clean_accuracy > clean_at_least, "{clean:?}");
    for (attack, r) in attacked {
        let accuracy = r.accuracy.expect("evaluated");
        assert!(
            accuracy >= clean_accuracy - 0.02,
            "{attack:?}: {accuracy} against {clean_accuracy} clean"
        );
    }
}

/// The attacks every hostile-worker test runs, in turn.
pub(crate) const ATTACKS: [Behaviour; 5] = [
    Behaviour::Scaled(-10.0),
    Behaviour::Noise(100.0),
    Behaviour::Zeros,
    Behaviour::Scaled(1.01),
    Behaviour::WrongBatch,
];

/// Four honest workers, `rounds` rounds of the scenario `build` makes of them, on a 10 ms,
/// 100 Mbit/s link, alone and then with a fifth that is each of [`ATTACKS`] in turn: the clean
/// run and each attacked one. Every attack is caught by recomputation and its worker banned
/// (the identity and its address); honest workers never are.
pub(crate) fn hostile_in_five(
    build: impl Fn(Vec<WorkerSpec>) -> Scenario,
    step: Duration,
    rounds: u64,
) -> (Report, Vec<(Behaviour, Report)>) {
    let link = Link::symmetric(ms(10), 100.0);
    let train = |hostile: Option<Behaviour>| {
        let mut workers = honest(4, link, step);
        if let Some(b) = hostile {
            workers.push(
                WorkerSpec::new(link, step)
                    .with_compression(Compression::Int8)
                    .behaving(b),
            );
        }
        let mut s = build(workers);
        s.until.rounds = Some(rounds);
        run(s)
    };
    let clean = train(None);
    let attacked = ATTACKS.map(|attack| {
        let r = train(Some(attack));
        assert_eq!(r.bans, 2, "{attack:?}: the identity and its address: {r:?}");
        assert_eq!(r.workers[4].ended.as_deref(), Some("banned"), "{attack:?}");
        assert!(r.workers[..4].iter().all(|w| w.ended.is_none()), "{r:?}");
        (attack, r)
    });
    (clean, attacked.into())
}

#[test]
fn async_mode_trains_on_links_of_every_speed() {
    let workers = vec![
        WorkerSpec::new(Link::LOOPBACK, ms(2)),
        WorkerSpec::new(Link::symmetric(ms(30), 50.0), ms(2)),
        WorkerSpec::new(Link::symmetric(ms(150), 5.0), ms(2)),
    ];
    let settings = Settings {
        mode: Mode::Async {
            buffer: 2,
            max_staleness: 8,
        },
        verify_fraction: 1.0,
        ..sync(1)
    };
    let mut s = scenario(32, workers, settings);
    s.until.rounds = Some(400);
    let r = run(s);
    assert_eq!(r.rounds, 400);
    assert_eq!(r.verification_mismatches, 0, "{r:?}");
    // The fast link answers most.
    assert!(
        r.workers[0].gradients_sent > r.workers[2].gradients_sent * 5,
        "{r:?}"
    );
}

/// The gradient noise scale (`noise.rs`) from real rounds: four workers' answers on the
/// digits MLP. It is a property of the model and its data, not of the batch: read at a
/// batch of 32 and of 128 a worker, it comes out alike, while the crowd's batch is 4×.
#[test]
fn the_noise_scale_is_the_models_not_the_batchs() {
    let read = |batch: u32| {
        let settings = Settings {
            batch_size: batch,
            ..sync(4)
        };
        let mut s = scenario(64, honest(4, Link::LOOPBACK, ms(2)), settings);
        s.until.rounds = Some(60);
        run(s).noise_scale.expect("rounds of four answers")
    };
    let (small, large) = (read(32), read(128));
    assert_eq!((small.crowd_batch, large.crowd_batch), (128.0, 512.0));
    assert_eq!((small.readings, large.readings), (60, 60));
    let (a, b) = (
        small.samples.expect("a signal"),
        large.samples.expect("a signal"),
    );
    eprintln!("noise scale at batch 32: {a:.0} samples; at batch 128: {b:.0}");
    assert!(a > 0.0 && b > 0.0);
    assert!((a / b).max(b / a) < 2.0, "{small:?} {large:?}");
}
