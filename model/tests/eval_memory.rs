//! What an evaluation allocates: a language model's scoring holds one chunk of windows and
//! one block's activations at a time, so its peak does not grow with the split, and stays
//! near what one chunk needs (issue 46: a 10.7M model's 256 validation windows went through
//! one forward pass that kept every block's training caches, 2.3 GB a block).
//!
//! A counting allocator measures the peak bytes live during `evaluate`; it is this test
//! binary's alone.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use model::gpt::GptSpec;
use model::{evaluate, Dataset, NetSpec, Network, Normalization, Shape, SplitMix64, Values};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; only the sizes are
// counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is System's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A GPT of 2 blocks, 4 heads, width 64, context 64 (about 110k parameters) and `windows`
/// random windows of its vocabulary.
fn setup(windows: usize) -> (Network, Vec<f32>, Dataset) {
    let spec = GptSpec {
        vocab: 65,
        context: 64,
        layers: 2,
        heads: 4,
        width: 64,
    };
    let net = Network::new(NetSpec::gpt(spec), 65).expect("a GPT");
    let params: Vec<f32> = net.init(3);
    let mut rng = SplitMix64::new(9);
    let ids = (0..windows * 65).map(|_| rng.below(65) as u8).collect();
    let data = Dataset::from_parts(
        Shape::flat(65),
        Values::U8(ids),
        vec![0; windows],
        Normalization::new(vec![0.0], vec![1.0]),
    )
    .expect("windows");
    (net, params, data)
}

/// Peak bytes allocated beyond what was live when `evaluate` started.
fn peak_during(net: &Network, params: &[f32], data: &Dataset) -> usize {
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let e = evaluate(net, params, data).expect("scores");
    assert!(e.loss.is_finite() && e.loss > 0.0, "{e:?}");
    PEAK.load(Ordering::Relaxed) - before
}

#[test]
fn scoring_a_gpt_holds_one_chunk_of_one_block_whatever_the_split() {
    // One test, so that nothing else allocates in this binary while it measures.
    let (net, params, small) = setup(256);
    let (_, _, large) = setup(1024);
    let at_256 = peak_during(&net, &params, &small);
    let at_1024 = peak_during(&net, &params, &large);
    println!("peak during evaluation: 256 windows {at_256} B, 1,024 windows {at_1024} B");
    // One chunk of 32 windows × 64 positions: one block's activations (about 86,000
    // values a window: 11 MB), the GELU's copy, the stream and the logits. Every window's
    // activations of both blocks at once, as before, were about 176 MB.
    assert!(at_256 < 24 << 20, "{at_256} bytes for 256 windows");
    assert!(
        at_1024 <= at_256 + at_256 / 10,
        "the peak grew with the split: {at_256} -> {at_1024} bytes"
    );
}
