//! Scratch buffers: f32 that start on a cache line, and vectors grown to
//! size without being cleared.

/// Makes `v` at least `len` long (new elements `value`, old ones kept).
pub(crate) fn grow<T: Clone>(v: &mut Vec<T>, len: usize, value: T) {
    if v.len() < len {
        v.resize(len, value);
    }
}

/// A growable buffer of f32 starting on a cache line: a 64-byte load from an
/// unaligned row touches two lines, which halves the loads a cycle can do.
#[derive(Default)]
pub(crate) struct Aligned(Vec<Line>);

#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct Line([f32; 16]);

impl Aligned {
    /// The first `len` values (grown if shorter; contents unspecified).
    pub(crate) fn floats(&mut self, len: usize) -> &mut [f32] {
        let lines = len.div_ceil(16);
        if self.0.len() < lines {
            self.0.resize(lines, Line::default());
        }
        // SAFETY: `Line` is 16 f32 without padding, so `lines` lines hold
        // at least `len` f32, aligned for f32.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast(), len) }
    }
}
