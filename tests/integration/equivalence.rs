use model::{assign_shards, batch_positions, Network};

use crate::util::*;

/// With 4 native workers, synchronous rounds, plain SGD and no dropouts, the weights after
/// 20 rounds equal single-process minibatch SGD on the union of the same batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_workers_equal_single_process_sgd_on_the_union_of_their_batches() {
    const ROUNDS: u64 = 20;
    const BATCH: usize = 32;
    const LR: f32 = 0.1;
    let swarm = swarm(
        &[
            "--min-workers",
            "4",
            "--optimizer",
            "sgd",
            "--lr",
            "0.1",
            "--batch-size",
            "32",
            "--max-rounds",
            "20",
            "--seed",
            "7",
        ],
        4,
    )
    .await;
    let weights = swarm.server.weights.clone();
    let (summary, _) = swarm.finish("20 rounds").await;
    assert_eq!(summary.rounds, ROUNDS);
    let distributed = snapshot_params(&weights.borrow());

    // The reference: one process, one model, the union of the four workers' batches.
    let data = server::dataset::load_default(7).expect("dataset");
    let mlp = Network::mlp(&[784, 128, 10]).expect("valid");
    let mut params: Vec<f32> = mlp.init(7);
    let shards = assign_shards(4, data.train.len());
    for round in 0..ROUNDS {
        let union: Vec<usize> = shards
            .iter()
            .flat_map(|shard| batch_positions(shard.len(), round, BATCH).map(|p| shard.start + p))
            .collect();
        assert_eq!(union.len(), 4 * BATCH);
        let (x, labels) = data.train.batch(union);
        let (_, grads) = mlp
            .loss_and_grad(&params, x.view(), &labels, 0)
            .expect("ok");
        for (p, g) in params.iter_mut().zip(&grads) {
            *p -= LR * g;
        }
    }
    let max_diff = distributed
        .iter()
        .zip(&params)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    println!("max |distributed - single-process| = {max_diff:e}");
    assert!(max_diff < 1e-5, "max abs diff {max_diff}");
    // And training moved the weights (the comparison is not between two untouched inits).
    let init: Vec<f32> = mlp.init(7);
    let moved = params
        .iter()
        .zip(&init)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(moved > 1e-3, "weights barely moved: {moved}");
}
