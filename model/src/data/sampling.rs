//! How the train split is cut into shards and a shard into batches.

use std::ops::Range;

/// Cuts `len` samples into `workers` contiguous shards whose sizes differ by at most one.
/// Worker `k` (in ascending worker-id order) gets shard `k`.
pub fn assign_shards(workers: usize, len: usize) -> Vec<Range<usize>> {
    if workers == 0 {
        return Vec::new();
    }
    let (base, extra) = (len / workers, len % workers);
    let mut start = 0;
    (0..workers)
        .map(|k| {
            let size = base + usize::from(k < extra);
            let range = start..start + size;
            start += size;
            range
        })
        .collect()
}

/// Which positions of a shard of `shard_len` samples make the batch for `round`: `batch`
/// consecutive positions (fewer if the shard is smaller), starting at `round · batch`,
/// wrapping around. Workers and the test reference both call this, so a round's batches are
/// known exactly.
pub fn batch_positions(shard_len: usize, round: u64, batch: usize) -> impl Iterator<Item = usize> {
    let n = batch.min(shard_len);
    let start = if shard_len == 0 {
        0
    } else {
        ((u128::from(round) * batch as u128) % shard_len as u128) as usize
    };
    (0..n).map(move |i| (start + i) % shard_len)
}
