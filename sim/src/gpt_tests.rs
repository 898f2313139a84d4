//! A GPT in virtual time under attack: one hostile worker in five, each attack of the set the
//! MLP's tests use, costs a language model no more than it costs the MLP, per step and in
//! local AdamW phases, and every cheat is banned.

use std::io::Read;

use coordinator_core::{Data, Local, LocalSteps, Settings};
use model::gpt::GptSpec;
use model::{Dataset, NetSpec, Network, Normalization, OptimizerKind, Shape, Values};
use protocol::Compression;

use crate::tests::{hostile_in_five, ms, scenario_of, sync};
use crate::*;

/// A sample's positions.
const CONTEXT: usize = 16;
/// Characters of the embedded Shakespeare the tests read.
const CHARACTERS: usize = 100_000;

/// The first [`CHARACTERS`] of the embedded Shakespeare as character ids (the corpus's
/// distinct characters in code point order), cut as the coordinator cuts text: training
/// windows of `CONTEXT + 1` every `CONTEXT / 4` ids over the first nine tenths, shuffled;
/// validation windows that do not overlap over the last tenth.
fn shakespeare() -> (Data, usize) {
    static GZ: &[u8] = include_bytes!("../../data/shakespeare8.txt.gz");
    let mut text = String::new();
    flate2::read::GzDecoder::new(GZ)
        .read_to_string(&mut text)
        .expect("the embedded text");
    let text: Vec<char> = text.chars().take(CHARACTERS).collect();
    let mut vocab = text.clone();
    vocab.sort_unstable();
    vocab.dedup();
    let ids: Vec<u8> = text
        .iter()
        .map(|c| vocab.binary_search(c).expect("in the vocabulary") as u8)
        .collect();
    let (train, test) = ids.split_at(ids.len() - ids.len() / 10);
    let windows = |stream: &[u8], stride: usize| {
        let starts: Vec<usize> = (0..=stream.len() - CONTEXT - 1).step_by(stride).collect();
        let values = starts
            .iter()
            .flat_map(|&s| stream[s..=s + CONTEXT].iter().copied())
            .collect();
        Dataset::from_parts(
            Shape::flat(CONTEXT + 1),
            Values::U8(values),
            vec![0; starts.len()],
            Normalization::new(vec![0.0], vec![1.0]),
        )
        .expect("windows")
    };
    let train = windows(train, CONTEXT / 4);
    let (train, _) = train.shuffled_split(42, train.len());
    let data = Data {
        train,
        test: windows(test, CONTEXT),
        classes: vocab.iter().map(|c| c.escape_debug().to_string()).collect(),
        description: "Shakespeare's first 100,000 characters".into(),
        vocabulary: None,
    };
    (data, vocab.len())
}

/// [`shakespeare`], read once.
fn text() -> &'static (Data, usize) {
    static DATA: std::sync::OnceLock<(Data, usize)> = std::sync::OnceLock::new();
    DATA.get_or_init(shakespeare)
}

/// Its vocabulary's size.
fn vocab() -> usize {
    text().1
}

/// A GPT of 2 blocks, 2 heads, width 32 on [`shakespeare`] (28k parameters).
fn gpt_scenario(workers: Vec<WorkerSpec>, settings: Settings) -> Scenario {
    let (data, vocab) = text().clone();
    let spec = GptSpec {
        vocab,
        context: CONTEXT,
        layers: 2,
        heads: 2,
        width: 32,
    };
    let net = Network::new(NetSpec::gpt(spec), vocab).expect("a gpt");
    scenario_of(net, data, workers, settings)
}

/// The share of what the clean run learnt (its drop in validation loss from a uniform
/// guess's `ln V`) that each attack took away, at worst.
fn worst_share_lost(clean: &Report, attacked: &[(Behaviour, Report)], vocab: usize) -> f64 {
    let uniform = (vocab as f64).ln();
    let clean_loss = clean.loss.expect("evaluated");
    assert!(
        clean_loss < uniform - 0.8,
        "the clean run learns: {clean:?}"
    );
    let shares = attacked.iter().map(|(attack, r)| {
        let loss = r.loss.expect("evaluated");
        println!("{attack:?}: loss {loss:.4} against {clean_loss:.4} clean");
        // A newcomer's answers are replayed before they count (probation): not one of the
        // cheat's did, so the attacked run differs from the clean one only by the fifth
        // worker's presence (five shards instead of four).
        assert_eq!(r.workers[4].accepted, 0, "{attack:?}: {r:?}");
        assert!(r.workers[4].poisoned > 0, "{attack:?}: it did attack");
        (loss - clean_loss) / (uniform - clean_loss)
    });
    shares.fold(f64::MIN, f64::max)
}

/// The MLP's bound (`one_hostile_in_five`: an attack costs at most 2 points of accuracy
/// against a clean run of at least 85 %) in the same terms: 2 points of the clean run's
/// climb from chance (10 %) to 85 %, 2.7 % of it.
const MLP_SHARE: f64 = 0.02 / (0.85 - 0.1);

fn gpt_settings() -> Settings {
    Settings {
        verify_fraction: 0.2,
        optimizer: OptimizerKind::AdamW {
            lr: 3e-3,
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-8,
            weight_decay: 0.1,
        },
        clip_norm: Some(1.0),
        batch_size: 16,
        eval_interval: 20,
        ..sync(4)
    }
}

/// Per-step exchange (AdamW on the coordinator, clipped): each attack costs the GPT at most
/// the share of its learning that the MLP's bound allows, and is banned.
#[test]
fn one_hostile_worker_in_five_costs_a_gpt_no_more_than_the_mlp() {
    let (clean, attacked) = hostile_in_five(|w| gpt_scenario(w, gpt_settings()), ms(2), 80);
    let worst = worst_share_lost(&clean, &attacked, vocab());
    assert!(
        worst <= MLP_SHARE,
        "{worst} of the learning lost, over {MLP_SHARE}"
    );
}

/// Local AdamW phases of 8 steps under outer Nesterov, every answer in int2 (a GPT's
/// defaults on home links, weights in int8): the same bound, every cheat banned; int2's
/// step, half a chunk's largest value, hides none (×1.01 included: each chunk's largest is
/// held to float order). (int8 answers under attack: the per-step test above and the MLP's
/// local phases, `local_tests`; int4's ×1.01, `checks::verify`.)
#[test]
fn one_hostile_worker_in_five_costs_a_gpt_in_local_phases_no_more_than_the_mlp() {
    let settings = Settings {
        local: Some(Local {
            steps: LocalSteps::Fixed(8),
            inner: OptimizerKind::AdamW {
                lr: 3e-3,
                beta1: 0.9,
                beta2: 0.99,
                eps: 1e-8,
                weight_decay: 0.1,
            },
            segment: 0,
        }),
        optimizer: OptimizerKind::Nesterov {
            lr: 0.7,
            momentum: 0.9,
        },
        clip_norm: None,
        eval_interval: 5,
        ..gpt_settings()
    };
    let build = |workers: Vec<WorkerSpec>| {
        let workers = workers
            .into_iter()
            .map(|w| w.with_compression(Compression::Int2))
            .collect();
        gpt_scenario(workers, settings.clone())
    };
    let (clean, attacked) = hostile_in_five(build, ms(2), 20);
    let worst = worst_share_lost(&clean, &attacked, vocab());
    assert!(
        worst <= MLP_SHARE,
        "{worst} of the learning lost, over {MLP_SHARE}"
    );
}
