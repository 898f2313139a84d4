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
//! - One address holds at most `--upload-slots-per-ip` slots (half of them by default), so
//!   connections from one address, each holding a slot as long as its pace allows, cannot
//!   keep everyone else's gradients out. A session over that share waits for its own
//!   address's turn first, and only then joins the queue for a slot: it never stands in that
//!   queue in front of another address's gradient.
//!
//! Memory for uploads is then `slots × 4·P` whatever K is. Fewer slots than workers uploading
//! at once costs nothing on a fast network (the coordinator decodes with 2 cores, not K), but
//! on slow links it makes uploads take turns: raise `--upload-memory` when many slow workers
//! send large models.

use std::collections::HashMap;
use std::net::IpAddr;
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
    /// Slots one address may hold at once.
    per_address: usize,
    /// Each address holding or waiting for a slot: its share, as a semaphore. Removed when
    /// nobody holds or waits on it (every clone is taken under this lock).
    addresses: Mutex<HashMap<IpAddr, Arc<Semaphore>>>,
}

impl UploadSlots {
    /// As many slots as `budget` bytes hold gradients of `values` values, at least
    /// [`MIN_SLOTS`]; one address holds at most `per_address` of them (default: half,
    /// rounded up), never fewer than one.
    pub fn new(budget: usize, values: usize, per_address: Option<usize>) -> Self {
        let bytes = values.max(1).saturating_mul(4);
        let slots = (budget / bytes).clamp(MIN_SLOTS, Semaphore::MAX_PERMITS);
        let per_address = per_address.unwrap_or(slots.div_ceil(2)).clamp(1, slots);
        Self {
            inner: Arc::new(Inner {
                permits: Arc::new(Semaphore::new(slots)),
                free: Mutex::new(Vec::new()),
                values,
                slots,
                waiting: AtomicUsize::new(0),
                per_address,
                addresses: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Slots one address may hold at once.
    pub fn per_address(&self) -> usize {
        self.inner.per_address
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

    /// A free slot for `ip` now, if there is one and `ip` has not its share already.
    /// Released slots go to waiters first, so this never overtakes a session already waiting.
    pub fn try_acquire(&self, ip: IpAddr) -> Option<Slot> {
        let share = self.share(ip);
        let address = Arc::clone(&share.semaphore).try_acquire_owned().ok()?;
        let permit = Arc::clone(&self.inner.permits).try_acquire_owned().ok()?;
        Some(Slot {
            _permit: permit,
            _address: address,
            _share: share,
            slots: self.clone(),
        })
    }

    /// Waits for `ip`'s turn within its share, then for a free slot. Waiters are served in
    /// the order they asked, as long as the future is kept (dropping it gives up its place).
    pub async fn acquire(self, ip: IpAddr) -> Slot {
        let waiting = Waiting::enter(&self.inner.waiting);
        let share = self.share(ip);
        let address = Arc::clone(&share.semaphore)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let permit = Arc::clone(&self.inner.permits)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        drop(waiting);
        Slot {
            _permit: permit,
            _address: address,
            _share: share,
            slots: self,
        }
    }

    /// Addresses holding or waiting for a slot right now.
    pub fn addresses(&self) -> usize {
        self.inner.addresses.lock().expect("not poisoned").len()
    }

    /// `ip`'s share, created at its first use.
    fn share(&self, ip: IpAddr) -> Share {
        let mut addresses = self.inner.addresses.lock().expect("not poisoned");
        let semaphore = addresses
            .entry(ip)
            .or_insert_with(|| Arc::new(Semaphore::new(self.inner.per_address)));
        Share {
            semaphore: Arc::clone(semaphore),
            ip,
            slots: Arc::clone(&self.inner),
        }
    }
}

/// One use of an address's share (holding or waiting). The last one to go removes the
/// address from the map.
#[derive(Debug)]
struct Share {
    semaphore: Arc<Semaphore>,
    ip: IpAddr,
    slots: Arc<Inner>,
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut addresses = self.slots.addresses.lock().expect("not poisoned");
        // This one, the map's, and any permit of it still alive: the permit of a Slot is
        // dropped before its Share (field order), so 2 means nobody else holds or waits.
        let ours = addresses
            .get(&self.ip)
            .is_some_and(|s| Arc::ptr_eq(s, &self.semaphore));
        if ours && Arc::strong_count(&self.semaphore) == 2 {
            addresses.remove(&self.ip);
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
/// (Fields drop in order: the address's permit before its share.)
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    _address: OwnedSemaphorePermit,
    _share: Share,
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
        let four = UploadSlots::new(16 << 20, 1_000_000, None);
        assert_eq!((four.slots(), four.per_address()), (4, 2));
        let many = UploadSlots::new(16 << 20, 100_000, None);
        assert_eq!((many.slots(), many.per_address()), (41, 21));
        let two = UploadSlots::new(1, 100_000, None);
        assert_eq!((two.slots(), two.per_address()), (MIN_SLOTS, 1));
        assert_eq!(UploadSlots::new(1, 100_000, Some(9)).per_address(), 2);
        assert_eq!(
            UploadSlots::new(usize::MAX, 0, None).slots(),
            Semaphore::MAX_PERMITS
        );
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    /// One address gets its share (2 of 4) and then waits, out of the queue for slots: the
    /// other address's gradients pass it while slots are free. It goes on when one of its
    /// own is given back; the address is forgotten once nothing of it is left.
    #[tokio::test]
    async fn one_address_holds_its_share_and_no_more() {
        let slots = UploadSlots::new(4 * 4000, 1000, None);
        assert_eq!((slots.slots(), slots.per_address()), (4, 2));
        let a1 = slots.try_acquire(A).expect("free");
        let a2 = slots.clone().acquire(A).await;
        assert!(slots.try_acquire(A).is_none(), "A has its share");
        let mut a3 = Box::pin(slots.clone().acquire(A));
        assert!(futures_util::poll!(&mut a3).is_pending());
        assert_eq!((slots.available(), slots.waiting()), (2, 1));
        // B is not behind A's waiter.
        let b1 = slots.try_acquire(B).expect("B's first");
        let b2 = slots.clone().acquire(B).await;
        assert_eq!((slots.available(), slots.addresses()), (0, 2));
        // A gives one back: its waiter takes that very slot.
        drop(a1);
        let std::task::Poll::Ready(a3) = futures_util::poll!(&mut a3) else {
            panic!("A gave a slot back, yet its third upload still waits");
        };
        assert_eq!((slots.available(), slots.waiting()), (0, 0));
        drop((a2, a3, b1));
        assert_eq!((slots.available(), slots.addresses()), (3, 1));
        drop(b2);
        assert_eq!((slots.available(), slots.addresses()), (4, 0));
        // A waiter that gives up leaves nothing behind either.
        let _hold = (slots.try_acquire(A), slots.try_acquire(A));
        let mut gave_up = Box::pin(slots.clone().acquire(A));
        assert!(futures_util::poll!(&mut gave_up).is_pending());
        drop(gave_up);
        drop(_hold);
        assert_eq!(
            (slots.available(), slots.addresses(), slots.waiting()),
            (4, 0, 0)
        );
    }

    #[tokio::test]
    async fn a_third_upload_waits_until_a_slot_is_given_back() {
        let slots = UploadSlots::new(0, 1000, Some(2));
        let a = slots.try_acquire(A).expect("two free");
        let b = slots.clone().acquire(A).await;
        assert_eq!(slots.available(), 0);
        assert!(slots.try_acquire(B).is_none());
        let mut third = Box::pin(slots.clone().acquire(B));
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
        let mut fourth = Box::pin(slots.clone().acquire(A));
        let _d = futures_util::poll!(&mut fourth);
        let mut fifth = Box::pin(slots.clone().acquire(B));
        assert!(futures_util::poll!(&mut fifth).is_pending());
        assert_eq!(slots.waiting(), 1);
        drop(fifth);
        assert_eq!(slots.waiting(), 0);
    }
}
