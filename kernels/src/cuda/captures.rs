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

    #[test]
    fn a_free_waits_for_another_threads_capture_to_end() {
        let (began, wait_began) = mpsc::channel();
        let (end, wait_end) = mpsc::channel::<()>();
        let capturer = thread::spawn(move || {
            let capture = Capture::begin();
            // Its own calls inside the capture run at once (no deadlock).
            outside_captures(|| ());
            began.send(()).unwrap();
            wait_end.recv().unwrap();
            drop(capture);
        });
        wait_began.recv().unwrap();
        let ran = Arc::new(AtomicBool::new(false));
        let freer = {
            let ran = ran.clone();
            thread::spawn(move || {
                // Nested calls run inside the outer one.
                outside_captures(|| outside_captures(|| ran.store(true, Ordering::SeqCst)))
            })
        };
        thread::sleep(Duration::from_millis(100));
        assert!(
            !ran.load(Ordering::SeqCst),
            "the free ran during another thread's capture"
        );
        end.send(()).unwrap();
        capturer.join().unwrap();
        freer.join().unwrap();
        assert!(ran.load(Ordering::SeqCst));
    }

    #[test]
    fn a_capture_waits_for_a_free_in_progress() {
        let (inside, wait_inside) = mpsc::channel();
        let (finish, wait_finish) = mpsc::channel::<()>();
        let freer = thread::spawn(move || {
            outside_captures(|| {
                inside.send(()).unwrap();
                wait_finish.recv().unwrap();
            })
        });
        wait_inside.recv().unwrap();
        let begun = Arc::new(AtomicBool::new(false));
        let capturer = {
            let begun = begun.clone();
            thread::spawn(move || {
                let _capture = Capture::begin();
                begun.store(true, Ordering::SeqCst);
            })
        };
        thread::sleep(Duration::from_millis(100));
        assert!(
            !begun.load(Ordering::SeqCst),
            "a capture began during a free"
        );
        finish.send(()).unwrap();
        freer.join().unwrap();
        capturer.join().unwrap();
        assert!(begun.load(Ordering::SeqCst));
    }
}
