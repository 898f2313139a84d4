//! One malloc arena for the whole coordinator (glibc).
//!
//! glibc gives threads that contend for the allocator arenas of their own (up to 8 per core),
//! and memory freed into one arena is reused by that arena only. The coordinator's large
//! allocations cross threads: a gradient is decoded by a session on one runtime thread and
//! aggregated by the coordinator task on another; weights frames are encoded on one and
//! dropped on whichever sent them last. With several arenas each keeps a high-water mark of
//! these, so resident memory grows with the number of workers although the heap does not. On
//! the bench at 1M parameters (docs/BENCHMARKS.md) one arena took the coordinator's peak RSS
//! from 78-84 MB to 60-66 MB at 4-64 workers; the two runtime threads rarely meet in malloc.

/// Call first thing in `main`, before any thread starts: an arena a thread already has stays.
#[allow(unsafe_code)]
pub fn use_one_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes a malloc tunable; it takes no pointers, and a failure
    // (return 0) leaves the default in place.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}
