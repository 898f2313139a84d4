//! Memory use stays bounded when a length field lies: decoding a small frame that claims a
//! huge tensor allocates nothing like the claimed size. Measured with a counting allocator.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use protocol::{decode_from_worker, encode_from_worker, GradientChunk, Round, WorkerToCoordinator};

struct Counting;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: delegates every call to `System` unchanged; only records the largest request.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn lying_lengths_allocate_at_most_the_frame_size() {
    let mut frame = encode_from_worker(&WorkerToCoordinator::Gradient(GradientChunk {
        compute_us: 0,
        parts: 1,
        round: Round(1),
        samples: 1,
        loss: 0.0,
        total: 16,
        offset: 0,
        grads: vec![1.0; 16],
    }));
    // Header, round, samples, loss, compute time, parts, total, offset, then the encoding byte.
    let count_at = 5 + 8 + 4 + 4 + 4 + 1 + 4 + 4 + 1;
    for claimed in [17u32, 1 << 20, 1 << 28, u32::MAX] {
        frame[count_at..count_at + 4].copy_from_slice(&claimed.to_le_bytes());
        LARGEST.store(0, Ordering::Relaxed);
        assert!(decode_from_worker(&frame).is_err());
        let largest = LARGEST.load(Ordering::Relaxed);
        assert!(
            largest <= frame.len(),
            "claimed {claimed} floats: allocated {largest} bytes for a {}-byte frame",
            frame.len()
        );
    }
}
