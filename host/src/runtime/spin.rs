//! Keeping the CPU pool's other threads awake during a graph step.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a kept-awake worker polls without finding work before it
/// returns to rayon's own idling (which sleeps). The gaps between a step's
/// parallel regions are far shorter; the bound is what makes the polling
/// safe (see [`KeepAwake`]).
const MAX_IDLE: Duration = Duration::from_millis(1);

/// While alive, every other thread of the current rayon pool busy-waits for
/// work instead of going to sleep between the step's parallel regions.
///
/// A worker's polling is a job, and rayon may run it on top of a job of the
/// same step: a worker that stole part of the step before the polling job
/// reached its queue, and then waits inside a `join` for the half another
/// worker took, runs the queued jobs while it waits, this one included.
/// The step cannot end until that worker gets back to its `join`, so a
/// poll that lasted until the step's end would never end (the engine once
/// hung so in CI). The poll therefore also ends after [`MAX_IDLE`] without
/// work: in that state nothing is left to run but what waits below it.
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
            let mut idle_since = None;
            while !flag.load(Ordering::Acquire) {
                match rayon::yield_now() {
                    Some(rayon::Yield::Executed) => idle_since = None,
                    _ => {
                        let since = *idle_since.get_or_insert_with(Instant::now);
                        if since.elapsed() > MAX_IDLE {
                            return;
                        }
                        std::thread::yield_now();
                    }
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

    /// The hang the idle bound prevents, staged step by step in a pool of
    /// two: worker B steals part of the step before the polling job reaches
    /// its queue, waits in a `join` for the half that worker A took, and runs
    /// the polling job there. Polling until the step's end would never end
    /// (checked: without the bound this test times out).
    #[test]
    fn a_worker_polling_inside_the_steps_own_join_lets_the_step_end() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let (finished, ended) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            pool.install(|| {
                let stolen_part_started = AtomicBool::new(false);
                let inner_half_taken = AtomicBool::new(false);
                let wait_for = |flag: &AtomicBool| {
                    while !flag.load(Ordering::Acquire) {
                        std::hint::spin_loop();
                    }
                };
                let (awake, ()) = rayon::join(
                    || {
                        // A: start polling only once B is inside the step.
                        wait_for(&stolen_part_started);
                        KeepAwake::start()
                    },
                    || {
                        // B (it stole this): its second half goes to A, which
                        // holds it while B waits in the join.
                        stolen_part_started.store(true, Ordering::Release);
                        rayon::join(
                            || wait_for(&inner_half_taken),
                            || {
                                inner_half_taken.store(true, Ordering::Release);
                                std::thread::sleep(Duration::from_millis(20));
                            },
                        );
                    },
                );
                drop(awake);
            });
            let _ = finished.send(());
        });
        assert!(
            ended.recv_timeout(Duration::from_secs(30)).is_ok(),
            "the step never ended: a worker polls on top of the join it waits in"
        );
    }
}
