//! Scratch buffers: f32 that start on a cache line, and vectors grown to
//! size without being cleared.

/// Makes `v` at least `len` long (new elements `value`, old ones kept).
pub(crate) fn grow<T: Clone>(v: &mut Vec<T>, len: usize, value: T) {
    if v.len() < len {
        v.resize(len, value);
    }
}

/// A growable buffer of f32 or bytes starting on a cache line: a 64-byte
/// load from an unaligned row touches two lines, which halves the loads a
/// cycle can do.
#[derive(Default)]
pub(crate) struct Aligned(Vec<Line>);

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

impl Aligned {
    /// Makes the buffer at least `bytes` long (contents unspecified).
    fn reserve(&mut self, bytes: usize) {
        let lines = bytes.div_ceil(64);
        if self.0.len() < lines {
            self.0.resize(lines, Line([0; 64]));
        }
    }

    /// The first `len` values as f32 (grown if shorter; contents
    /// unspecified).
    pub(crate) fn floats(&mut self, len: usize) -> &mut [f32] {
        self.reserve(4 * len);
        // SAFETY: the lines hold at least `4 * len` bytes, any of which is
        // a valid f32, aligned for f32.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast(), len) }
    }

    /// The first `len` bytes (grown if shorter; contents unspecified).
    pub(crate) fn bytes(&mut self, len: usize) -> &mut [u8] {
        self.reserve(len);
        // SAFETY: the lines hold at least `len` bytes.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast(), len) }
    }

    /// All the bytes.
    pub(crate) fn all_bytes(&self) -> &[u8] {
        // SAFETY: the lines are `64 * len` initialized bytes.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast(), 64 * self.0.len()) }
    }
}
