//! Where a worker computes its batches' gradients: on this thread, on several threads of
//! this process, or wherever its transport sends them (a browser tab's Web Workers).
//!
//! With `k` cores a batch is computed in `k` parts ([`model::Part`]) added in part order,
//! so the answer depends on `k` alone, never on which core computed which part or when;
//! the answer says `k` (`Gradient::parts`) and the coordinator recomputes in as many.

use std::borrow::Cow;

use model::{ModelError, Network, Part};
use ndarray::{s, ArrayView2};

/// How a worker computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compute {
    /// Here, each batch in this many parts on as many threads (1: on this thread alone).
    Threads(usize),
    /// In this many parts, by the transport: [`crate::WorkerCore::job`] says what to
    /// compute, [`crate::WorkerCore::complete`] takes the result.
    Deferred(usize),
    /// By the transport, the whole batch at once in an order the coordinator cannot
    /// replay (a tab's GPU): answered with `Gradient::parts` 0, which the verifier checks
    /// within rounding. A local phase too when its `Task` names a segment length (it is
    /// committed every so many steps and checked by segments, `commit.rs`); else in one
    /// ordered part (its replay must be exact).
    Unordered,
}

impl Default for Compute {
    fn default() -> Self {
        Self::Threads(1)
    }
}

impl Compute {
    /// The parts a batch is split into, before [`Part::split`] bounds them by its rows;
    /// 0 for [`Compute::Unordered`].
    pub fn parts(self) -> usize {
        match self {
            Self::Threads(k) | Self::Deferred(k) => k.clamp(1, model::MAX_PARTS),
            Self::Unordered => 0,
        }
    }

    /// Whether the transport computes ([`crate::WorkerCore::job`]).
    pub fn deferred(self) -> bool {
        !matches!(self, Self::Threads(_))
    }
}

/// One batch's gradient to compute.
#[derive(Debug)]
pub struct Job<'a> {
    pub net: &'a Network,
    /// Full layout (frozen tensors included).
    pub weights: Cow<'a, [f32]>,
    pub x: ArrayView2<'a, f32>,
    pub labels: &'a [u8],
    pub seed: u64,
    /// Whether it is an inner step of a local phase (else the answer to weights).
    pub step: bool,
    parts: usize,
}

impl<'a> Job<'a> {
    /// The gradient of `net` at `weights` on a batch (`x`, `labels`) with dropout seed
    /// `seed`, in `parts` parts.
    pub fn new(
        net: &'a Network,
        weights: Cow<'a, [f32]>,
        (x, labels): (ArrayView2<'a, f32>, &'a [u8]),
        seed: u64,
        parts: usize,
    ) -> Self {
        Self {
            net,
            weights,
            x,
            labels,
            seed,
            step: false,
            parts,
        }
    }

    /// Whether it may be computed in any order (a GPU): the whole batch at once.
    pub fn unordered(&self) -> bool {
        self.parts == 0
    }

    /// The parts to compute, one a core, whose results are added in this order (one for
    /// an unordered job).
    pub fn parts(&self) -> Vec<Part> {
        Part::split(self.x.nrows(), self.parts)
    }

    /// One part's rows of the batch, and their labels.
    pub fn rows(&self, part: Part) -> (ArrayView2<'a, f32>, &'a [u8]) {
        (
            self.x.slice_move(s![part.rows(), ..]),
            &self.labels[part.rows()],
        )
    }

    /// Computes one part (what one core does).
    pub fn part(&self, part: Part) -> Result<(f32, Vec<f32>), ModelError> {
        let mut grads = Vec::new();
        let loss = self.part_into(part, &mut grads)?;
        Ok((loss, grads))
    }

    /// The same into `grads` (its memory reused).
    pub fn part_into(&self, part: Part, grads: &mut Vec<f32>) -> Result<f32, ModelError> {
        let (x, labels) = self.rows(part);
        self.net
            .part_loss_and_grad_into(&self.weights, x, labels, self.seed, part, grads)
    }

    /// Computes the whole job on this thread, its parts one after the other.
    pub fn run(&self) -> Result<(f32, Vec<f32>), ModelError> {
        let parts = Part::count(self.x.nrows(), self.parts);
        self.net
            .loss_and_grad_parts(&self.weights, self.x, self.labels, self.seed, parts)
    }

    /// Computes the whole job on `cores`, a part on each of its threads (one after the
    /// other where it has fewer): the loss, and the gradient in [`Cores::gradient`].
    pub fn run_on(&self, cores: &mut Cores) -> Result<f32, ModelError> {
        let parts = self.parts();
        cores.buffers.resize_with(parts.len().max(1), Vec::new);
        let mut losses = vec![Ok(0.0); parts.len()];
        match &cores.pool {
            #[cfg(not(target_arch = "wasm32"))]
            Some(pool) if parts.len() > 1 => {
                // Each thread computes in this thread's float order (a verifier sets one).
                let order = model::gemm::order();
                pool.scope(|scope| {
                    let mut work = parts.iter().zip(&mut cores.buffers).zip(&mut losses);
                    let first = work.next().expect("a part at least");
                    for ((&part, grads), loss) in work {
                        scope.spawn(move |_| {
                            *loss = model::with_order(order, || self.part_into(part, grads));
                        });
                    }
                    // The scope itself runs on one of the pool's threads too.
                    let ((&part, grads), loss) = first;
                    *loss = model::with_order(order, || self.part_into(part, grads));
                });
            }
            _ => {
                for ((&part, grads), loss) in parts.iter().zip(&mut cores.buffers).zip(&mut losses)
                {
                    *loss = self.part_into(part, grads);
                }
            }
        }
        let (first, rest) = cores.buffers.split_at_mut(1);
        let mut total = 0.0;
        for (i, loss) in losses.into_iter().enumerate() {
            total += loss?;
            if i > 0 {
                for (s, g) in first[0].iter_mut().zip(&rest[i - 1]) {
                    *s += g;
                }
            }
        }
        Ok(total)
    }
}

/// This process's cores for computing batches: a pool of threads (none for one), and each
/// part's gradient buffer, both kept from batch to batch.
#[derive(Debug, Default)]
pub struct Cores {
    #[cfg(not(target_arch = "wasm32"))]
    pool: Option<rayon::ThreadPool>,
    #[cfg(target_arch = "wasm32")]
    pool: Option<()>,
    buffers: Vec<Vec<f32>>,
}

impl Cores {
    /// `threads` threads (on wasm32, which has none here, parts run one after the other).
    pub fn new(threads: usize) -> Self {
        #[cfg(not(target_arch = "wasm32"))]
        let pool = (threads > 1)
            .then(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("gradient-{i}"))
                    .build()
                    .ok()
            })
            .flatten();
        #[cfg(target_arch = "wasm32")]
        let pool = {
            let _ = threads;
            None
        };
        Self {
            pool,
            buffers: Vec::new(),
        }
    }

    /// The gradient [`Job::run_on`] computed last (full layout).
    pub fn gradient(&self) -> &[f32] {
        self.buffers.first().map_or(&[], Vec::as_slice)
    }

    /// Takes it out (to use while `self` is borrowed otherwise); [`Cores::put_back`]
    /// returns its memory for the next batch.
    pub fn take_gradient(&mut self) -> Vec<f32> {
        self.buffers
            .first_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    pub fn put_back(&mut self, gradient: Vec<f32>) {
        if let Some(first) = self.buffers.first_mut() {
            *first = gradient;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads compute exactly what one thread computes in as many parts, in either float
    /// order, and within rounding of the batch at once.
    #[test]
    fn threads_compute_the_parts_gradient_bit_for_bit() {
        let spec: model::NetSpec =
            "input 1x8x8; conv2d 4 k3 p1; relu; maxpool 2; flatten; dense 16; relu; dropout 0.3; dense 3"
                .parse()
                .expect("spec");
        let net = Network::new(spec, 3).expect("net");
        let weights: Vec<f32> = net.init(1);
        let mut rng = model::SplitMix64::new(2);
        let x = ndarray::Array2::from_shape_fn((16, 64), |_| rng.next_f64() as f32);
        let labels: Vec<u8> = (0..16).map(|i| (i % 3) as u8).collect();
        for order in [model::Order::Library, model::Order::Unfused] {
            for k in [1, 2, 3, 4] {
                let job = Job::new(&net, Cow::Borrowed(&weights), (x.view(), &labels), 7, k);
                let mut cores = Cores::new(k);
                // Twice: the second batch reuses the buffers of the first.
                let mut threaded = (0.0, Vec::new());
                for _ in 0..2 {
                    let loss = model::with_order(order, || job.run_on(&mut cores)).expect("runs");
                    threaded = (loss, cores.gradient().to_vec());
                }
                let sequential = model::with_order(order, || {
                    net.loss_and_grad_parts(&weights, x.view(), &labels, 7, k)
                })
                .expect("runs");
                assert_eq!(threaded.0.to_bits(), sequential.0.to_bits());
                assert!(
                    threaded
                        .1
                        .iter()
                        .zip(&sequential.1)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{k} threads, {order:?}"
                );
                let (_, whole) = net
                    .loss_and_grad(&weights, x.view(), &labels, 7)
                    .expect("whole");
                for (a, b) in threaded.1.iter().zip(&whole) {
                    assert!((a - b).abs() <= 1e-6 + 1e-5 * b.abs(), "{a} vs {b}");
                }
            }
        }
    }
}
