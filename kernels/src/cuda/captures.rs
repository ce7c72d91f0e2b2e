//! Stream captures across threads. Allocating and freeing device or pinned
//! memory (and what does so inside it: opening a device, loading a module,
//! dropping a device) synchronize the context, and contexts are shared: every
//! [`super::driver::CudaDevice`] of a card in a process is on its primary
//! context. Made on one thread while another thread's stream is capturing a
//! graph, such a call invalidates that capture
//! (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`; seen on the H200 on 2026-12-04,
//! where tests running on parallel threads failed so and passed one at a
//! time; PyTorch's caching allocator holds its frees back during captures
//! for the same reason). So those calls run through [`outside_captures`],
//! which waits until no other thread is capturing, and each capture holds a
//! [`Capture`] from its start to its end. Captures are short (one decode
//! step's launches), so the wait is too.

use std::cell::Cell;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::{self, ThreadId};

/// The threads capturing now (one entry per capture in progress).
static CAPTURING: Mutex<Vec<ThreadId>> = Mutex::new(Vec::new());
/// Signalled when a capture ends.
static ENDED: Condvar = Condvar::new();

thread_local! {
    /// Whether this thread is inside [`outside_captures`] already (a call
    /// made inside another runs at once: the lock is held).
    static OUTSIDE: Cell<bool> = const { Cell::new(false) };
}

fn capturing() -> MutexGuard<'static, Vec<ThreadId>> {
    CAPTURING.lock().unwrap_or_else(|e| e.into_inner())
}

/// A capture in progress on the thread that began it; dropping it ends it.
#[derive(Debug)]
pub struct Capture {
    thread: ThreadId,
}

impl Capture {
    /// Registers a capture about to begin on this thread, after any
    /// [`outside_captures`] call running on another thread has finished.
    pub fn begin() -> Self {
        let thread = thread::current().id();
        capturing().push(thread);
        Self { thread }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let mut threads = capturing();
        if let Some(at) = threads.iter().position(|t| *t == self.thread) {
            threads.swap_remove(at);
        }
        ENDED.notify_all();
    }
}

/// Runs `f` once no other thread is capturing, and keeps captures from
/// beginning until it returns. On a thread that is capturing itself, `f`
/// runs at once: the driver refuses such calls inside a capture on its own.
pub fn outside_captures<R>(f: impl FnOnce() -> R) -> R {
    if OUTSIDE.with(Cell::get) {
        return f();
    }
    let me = thread::current().id();
    let guard = capturing();
    let _guard = ENDED
        .wait_while(guard, |threads| {
            !threads.contains(&me) && !threads.is_empty()
        })
        .unwrap_or_else(|e| e.into_inner());
    OUTSIDE.with(|o| o.set(true));
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            OUTSIDE.with(|o| o.set(false));
        }
    }
    let _reset = Reset;
    f()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    /// Runs `holder` on a thread, which calls the function it is given
    /// while it holds what it holds (that function returns when the test
    /// lets go), then `waiter` on another: `waiter` must not finish before
    /// the holder lets go, and must finish after.
    fn assert_waits(holder: fn(&dyn Fn()), waiter: fn(), what: &str) {
        let (holding, wait_holding) = mpsc::channel();
        let (release, wait_release) = mpsc::channel::<()>();
        let holder = thread::spawn(move || {
            holder(&|| {
                holding.send(()).unwrap();
                wait_release.recv().unwrap();
            })
        });
        wait_holding.recv().unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let waiter = {
            let done = done.clone();
            thread::spawn(move || {
                waiter();
                done.store(true, Ordering::SeqCst);
            })
        };
        thread::sleep(Duration::from_millis(100));
        assert!(!done.load(Ordering::SeqCst), "{what}");
        release.send(()).unwrap();
        holder.join().unwrap();
        waiter.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
    }

    #[test]
    fn a_free_waits_for_another_threads_capture_to_end() {
        assert_waits(
            |held| {
                let _capture = Capture::begin();
                // Its own calls inside the capture run at once (no deadlock).
                outside_captures(|| ());
                held();
            },
            // Nested calls run inside the outer one.
            || outside_captures(|| outside_captures(|| ())),
            "the free ran during another thread's capture",
        );
    }

    #[test]
    fn a_capture_waits_for_a_free_in_progress() {
        assert_waits(
            |held| outside_captures(held),
            || drop(Capture::begin()),
            "a capture began during a free",
        );
    }
}
