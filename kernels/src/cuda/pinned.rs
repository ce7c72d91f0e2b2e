//! Pinned host memory of the real GPU's device (`driver.rs`): the staging
//! buffer uploads go through and the slots readbacks land in.

use cudarc::driver::{result, sys};

use super::captures::outside_captures;
use super::device::DeviceResult;
use super::driver::driver_error;

/// Pinned host memory uploads are staged through.
const STAGING_BYTES: usize = 8 << 20;

/// Pinned memory one readback's copies land in, and the event recorded
/// after them (waiting for it waits for the copies, not for later work).
pub(super) struct ReadbackSlot {
    pub(super) base: *mut u8,
    pub(super) capacity: usize,
    pub(super) event: sys::CUevent,
    /// The readback using it: its bytes, and `Inner::issued` before it.
    pub(super) in_use: Option<(usize, u64)>,
}

/// Pinned host memory that uploads go through, so that an upload is queued
/// without waiting: the caller's bytes are copied here and the stream copies
/// them on by DMA. Space is handed out in order and reclaimed all at once
/// whenever the host waits for the stream (every step ends with a wait for
/// its sampled tokens); an upload that does not fit waits first, one larger
/// than the whole buffer (weights at load) goes from pageable memory and is
/// waited for.
pub(super) struct Staging {
    pub(super) base: *mut u8,
    pub(super) capacity: usize,
    pub(super) used: usize,
}

impl Staging {
    /// `STAGING_BYTES` of pinned memory, or none (every upload then waits)
    /// where the driver refuses to pin it.
    pub(super) fn new() -> Self {
        // SAFETY: a plain pinned allocation, freed in `Drop`.
        match unsafe { result::malloc_host(STAGING_BYTES, 0) } {
            Ok(base) => Self {
                base: base.cast(),
                capacity: STAGING_BYTES,
                used: 0,
            },
            Err(_) => Self {
                base: std::ptr::null_mut(),
                capacity: 0,
                used: 0,
            },
        }
    }
}

/// A free readback slot of at least `bytes` (reusing or growing a free
/// one, else a new one).
pub(super) fn readback_slot(
    readbacks: &mut Vec<ReadbackSlot>,
    bytes: usize,
) -> DeviceResult<usize> {
    let free = |s: &ReadbackSlot| s.in_use.is_none();
    if let Some(i) = readbacks
        .iter()
        .position(|s| free(s) && s.capacity >= bytes)
    {
        return Ok(i);
    }
    let capacity = bytes.next_power_of_two().max(4096);
    // SAFETY: a plain pinned allocation, freed when replaced or in `Drop`.
    let base = outside_captures(|| unsafe { result::malloc_host(capacity, 0) })
        .map_err(driver_error("pinning readback memory"))?
        .cast::<u8>();
    if let Some(i) = readbacks.iter().position(free) {
        let slot = &mut readbacks[i];
        // SAFETY: no queued copy writes a free slot's memory.
        let _ = outside_captures(|| unsafe { result::free_host(slot.base.cast()) });
        slot.base = base;
        slot.capacity = capacity;
        return Ok(i);
    }
    let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
        .map_err(driver_error("cuEventCreate"))?;
    readbacks.push(ReadbackSlot {
        base,
        capacity,
        event,
        in_use: None,
    });
    Ok(readbacks.len() - 1)
}
