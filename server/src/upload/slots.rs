//! The coordinator's memory for gradients being received, bounded by `--upload-memory`.
//!
//! A gradient arrives in chunks over as long as its worker's link takes, and it cannot be
//! added to anything before its last chunk passed the checks (its norm, its finiteness, and
//! later verification and robust aggregation need it whole). So every gradient under way
//! needs room for all its values, and without a bound K workers uploading at once need K
//! gradients' worth. Here that room is a fixed number of slots, one gradient each:
//!
//! - A session takes a slot when a gradient's first chunk arrives, waiting (first come, first
//!   served) while none is free. While it waits it does not read its socket, so the worker's
//!   bytes wait in the kernel and in the worker, not in the coordinator.
//! - The slot goes with the whole gradient to the coordinator, which gives it back once the
//!   gradient is aggregated (or refused). A refused upload gives it back when its session ends.
//! - Slots keep their buffers: the next gradient is decoded into memory already mapped,
//!   instead of asking the allocator for (and faulting in) a fresh 4·P bytes each time.
//!
//! Memory for uploads is then `slots × 4·P` whatever K is. Fewer slots than workers uploading
//! at once costs nothing on a fast network (the coordinator decodes with 2 cores, not K), but
//! on slow links it makes uploads take turns: raise `--upload-memory` when many slow workers
//! send large models.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// `--upload-memory` default, in MiB.
pub const DEFAULT_UPLOAD_MEMORY_MIB: usize = 16;

/// Slots are never fewer than this, whatever the budget: one gradient being decoded while
/// another is aggregated.
pub const MIN_SLOTS: usize = 2;

/// The shared pool of slots. Cloning shares it.
#[derive(Debug, Clone)]
pub struct UploadSlots {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    permits: Arc<Semaphore>,
    /// Buffers given back, ready for the next gradient.
    free: Mutex<Vec<Vec<f32>>>,
    /// Values in one gradient.
    values: usize,
    slots: usize,
    /// Sessions waiting for a slot.
    waiting: AtomicUsize,
}

impl UploadSlots {
    /// As many slots as `budget` bytes hold gradients of `values` values, at least
    /// [`MIN_SLOTS`].
    pub fn new(budget: usize, values: usize) -> Self {
        let bytes = values.max(1).saturating_mul(4);
        let slots = (budget / bytes).clamp(MIN_SLOTS, Semaphore::MAX_PERMITS);
        Self {
            inner: Arc::new(Inner {
                permits: Arc::new(Semaphore::new(slots)),
                free: Mutex::new(Vec::new()),
                values,
                slots,
                waiting: AtomicUsize::new(0),
            }),
        }
    }

    pub fn slots(&self) -> usize {
        self.inner.slots
    }

    /// Slots free right now.
    pub fn available(&self) -> usize {
        self.inner.permits.available_permits()
    }

    /// Sessions waiting for a slot right now.
    pub fn waiting(&self) -> usize {
        self.inner.waiting.load(Ordering::Relaxed)
    }

    /// A free slot now, if there is one. Released slots go to waiters first, so this never
    /// overtakes a session already waiting.
    pub fn try_acquire(&self) -> Option<Slot> {
        let permit = Arc::clone(&self.inner.permits).try_acquire_owned().ok()?;
        Some(Slot {
            _permit: permit,
            slots: self.clone(),
        })
    }

    /// Waits for a free slot. Waiters are served in the order they asked, as long as the
    /// future is kept (dropping it gives up its place).
    pub async fn acquire(self) -> Slot {
        let waiting = Waiting::enter(&self.inner.waiting);
        let permit = Arc::clone(&self.inner.permits)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        drop(waiting);
        Slot {
            _permit: permit,
            slots: self,
        }
    }
}

/// Counts a waiter for as long as it lives (a session that ends while waiting drops it).
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn enter(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One gradient's room. Dropping it frees the slot; [`Slot::recycle`] also keeps the buffer.
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    slots: UploadSlots,
}

impl Slot {
    /// An empty buffer with room for one gradient: a recycled one if any.
    pub fn buffer(&self) -> Vec<f32> {
        let recycled = self.slots.inner.free.lock().expect("not poisoned").pop();
        match recycled {
            Some(mut buffer) => {
                buffer.clear();
                buffer
            }
            None => Vec::with_capacity(self.slots.inner.values),
        }
    }

    /// Frees the slot and keeps `buffer` for the next gradient (if it is one's size).
    pub fn recycle(self, buffer: Vec<f32>) {
        if buffer.capacity() >= self.slots.inner.values {
            let mut free = self.slots.inner.free.lock().expect("not poisoned");
            // At most one buffer per slot is ever kept.
            if free.len() < self.slots.inner.slots {
                free.push(buffer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_sets_the_slots_with_a_floor() {
        assert_eq!(UploadSlots::new(16 << 20, 1_000_000).slots(), 4);
        assert_eq!(UploadSlots::new(16 << 20, 100_000).slots(), 41);
        assert_eq!(UploadSlots::new(1, 100_000).slots(), MIN_SLOTS);
        assert_eq!(
            UploadSlots::new(usize::MAX, 0).slots(),
            Semaphore::MAX_PERMITS
        );
    }

    #[tokio::test]
    async fn a_third_upload_waits_until_a_slot_is_given_back() {
        let slots = UploadSlots::new(0, 1000);
        let a = slots.try_acquire().expect("two free");
        let b = slots.clone().acquire().await;
        assert_eq!(slots.available(), 0);
        assert!(slots.try_acquire().is_none());
        let mut third = Box::pin(slots.clone().acquire());
        assert!(futures_util::poll!(&mut third).is_pending());
        assert_eq!(slots.waiting(), 1);
        let buffer = a.buffer();
        assert!(buffer.capacity() >= 1000);
        let ptr = buffer.as_ptr();
        a.recycle(buffer);
        let std::task::Poll::Ready(c) = futures_util::poll!(&mut third) else {
            panic!("a slot was given back, yet the third upload still waits");
        };
        assert_eq!(slots.waiting(), 0);
        // The buffer given back is the next one handed out, emptied.
        let reused = c.buffer();
        assert_eq!(reused.as_ptr(), ptr);
        assert!(reused.is_empty());
        drop(b);
        assert_eq!(slots.available(), 1);
        // A waiter that gives up is no longer counted.
        let _c = c;
        let mut fourth = Box::pin(slots.clone().acquire());
        let _d = futures_util::poll!(&mut fourth);
        let mut fifth = Box::pin(slots.clone().acquire());
        assert!(futures_util::poll!(&mut fifth).is_pending());
        assert_eq!(slots.waiting(), 1);
        drop(fifth);
        assert_eq!(slots.waiting(), 0);
    }
}
