//! Software prefetch for the single-row (decode) kernels.
//!
//! A decode step streams every weight once, row after row, from memory that
//! is not in the core's caches. The hardware prefetchers alone left the
//! kernels waiting on memory: a SmolLM2 decode step's products ran at a
//! third of the machine's read bandwidth (`quant_decode_step` benchmark,
//! `bench/cpu/NOTES.md`). Asking for the bytes a few kilobytes ahead of the
//! row being computed keeps the stream in flight.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};

/// How far ahead of the row being computed the kernels prefetch, in bytes
/// (measured best of 1–8 KiB on an AVX-512 Xeon; see the module docs).
pub(crate) const PREFETCH_AHEAD: usize = 3 << 10;

/// Rows of `row_bytes` from `w`, each with the weight bytes `PREFETCH_AHEAD`
/// beyond it requested into L1: a row-by-row kernel loops over this instead
/// of `w.chunks_exact(row_bytes)`.
#[inline(always)]
pub(crate) fn rows_prefetched(w: &[u8], row_bytes: usize) -> impl Iterator<Item = &[u8]> {
    w.chunks_exact(row_bytes.max(1))
        .enumerate()
        .map(move |(i, row)| {
            let start = (i * row_bytes).saturating_add(PREFETCH_AHEAD);
            if let Some(ahead) = w.get(start..(start + row_bytes).min(w.len())) {
                for line in ahead.chunks(64) {
                    prefetch(line);
                }
            }
            row
        })
}

#[inline(always)]
fn prefetch(line: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint: it never faults, and the address is
    // inside `line` anyway. SSE is part of x86-64.
    unsafe {
        _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = line;
}
