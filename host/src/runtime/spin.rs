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

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use rayon::prelude::*;

    use super::*;

    /// The other workers run the step's parallel work while kept awake, and
    /// stop polling once the guard is gone (their closure, which holds the
    /// flag, is then dropped).
    #[test]
    fn workers_stop_polling_when_the_step_ends() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let flag = pool.install(|| {
            let awake = KeepAwake::start();
            let flag = Arc::clone(&awake.done);
            let sum: u64 = (0..100_000u64).into_par_iter().sum();
            assert_eq!(sum, 100_000 * 99_999 / 2);
            flag
        });
        assert!(flag.load(Ordering::Acquire));
        let start = Instant::now();
        while Arc::strong_count(&flag) > 1 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "a worker still polls after the step"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
