//! Keeping the CPU pool's other threads awake during a graph step.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// While alive, every other thread of the current rayon pool busy-waits for
/// work instead of going to sleep between the step's parallel regions.
pub(crate) struct KeepAwake {
    done: Arc<AtomicBool>,
}

impl KeepAwake {
    /// Call from a thread of the pool the step runs in.
    pub(crate) fn start() -> Self {
        let done = Arc::new(AtomicBool::new(false));
        let me = rayon::current_thread_index();
        let flag = Arc::clone(&done);
        rayon::spawn_broadcast(move |ctx| {
            if Some(ctx.index()) == me {
                return;
            }
            while !flag.load(Ordering::Acquire) {
                if let Some(rayon::Yield::Idle) = rayon::yield_now() {
                    std::thread::yield_now();
                }
            }
        });
        Self { done }
    }
}

impl Drop for KeepAwake {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Release);
    }
}
