//! Buffer reuse by liveness: when a value dies (its last reader has run) its
//! float buffer returns here, and the next kernel output of a similar size
//! takes it instead of allocating. The pool lives as long as the executor,
//! so steady-state decode steps allocate nothing for their large values.

use std::sync::Mutex;

use super::tensor::{Data, Tensor};

/// Buffers kept at most; beyond that, freed buffers go back to the allocator.
const MAX_BUFFERS: usize = 64;

/// Free f32 buffers.
#[derive(Debug, Default)]
pub struct BufferPool {
    free: Mutex<Vec<Vec<f32>>>,
}

impl BufferPool {
    /// A zeroed buffer of `len` floats: the smallest free one that fits, else
    /// a new one.
    pub fn take(&self, len: usize) -> Vec<f32> {
        let mut buffer = self.take_free(len);
        buffer.clear();
        buffer.resize(len, 0.0);
        buffer
    }

    /// A buffer of `len` floats for a kernel that writes every element: a
    /// reused buffer keeps its old values (only a grown tail is zeroed), so
    /// nothing is cleared that is about to be overwritten.
    pub fn take_for_overwrite(&self, len: usize) -> Vec<f32> {
        let mut buffer = self.take_free(len);
        buffer.truncate(len);
        buffer.resize(len, 0.0);
        buffer
    }

    /// The smallest free buffer with room for `len` floats, else a new one.
    fn take_free(&self, len: usize) -> Vec<f32> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        best.map(|i| free.swap_remove(i)).unwrap_or_default()
    }

    /// Returns a dead value's buffer.
    pub fn give(&self, tensor: Tensor) {
        if let Data::F32(buffer) = tensor.data {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            if free.len() < MAX_BUFFERS && buffer.capacity() > 0 {
                free.push(buffer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_for_overwrite_are_reused_without_clearing() {
        let pool = BufferPool::default();
        pool.give(Tensor::f32(vec![4], vec![1.0; 4]));
        assert_eq!(pool.take_for_overwrite(3), [1.0; 3], "not cleared");
        // A buffer with room beyond its length: the old values stay, the
        // grown tail is zeroed.
        let mut roomy = Vec::with_capacity(8);
        roomy.extend([2.0; 2]);
        pool.give(Tensor::f32(vec![2], roomy));
        let grown = pool.take_for_overwrite(4);
        assert!(grown.capacity() >= 8, "the pooled buffer");
        assert_eq!(grown, [2.0, 2.0, 0.0, 0.0]);
        assert_eq!(pool.take_for_overwrite(7), [0.0; 7], "a new buffer");
    }

    #[test]
    fn buffers_are_reused_best_fit_and_zeroed() {
        let pool = BufferPool::default();
        pool.give(Tensor::f32(vec![100], vec![1.0; 100]));
        pool.give(Tensor::f32(vec![10], vec![1.0; 10]));
        let small = pool.take(8);
        assert_eq!(small.capacity(), 10, "the smallest buffer that fits");
        assert_eq!(small, vec![0.0; 8]);
        let large = pool.take(50);
        assert!(large.capacity() >= 100);
        assert!(
            pool.take(1000).capacity() >= 1000,
            "a new buffer when none fits"
        );
    }
}
