//! The launch shape of `flash_attention.cu`'s kernels, as its `KILN_FLASH_*`
//! macros fix it: the host and the tests launch them from here.

/// Query rows a block takes (four warps of two 16-row tiles).
pub const ROWS: usize = 128;
/// Threads a block.
pub const THREADS: u32 = 128;
/// Cache positions a key or value tile holds.
const KEYS: usize = 64;

/// Dynamic shared memory a block needs for heads of `head_dim` over a cache
/// of `cache_bytes`-byte elements: the query tile and the key and value
/// tiles in bf16, rows padded by 8 values, and an E4M3 tile as copied
/// (`cache_bytes` 1). Past 48 KiB (heads of 96 and 128), which the driver
/// opts the kernel in to.
pub fn shared_bytes(head_dim: usize, cache_bytes: usize) -> u32 {
    let tiles = (ROWS + 2 * KEYS) * (head_dim + 8) * 2;
    let stage = if cache_bytes == 1 { KEYS * head_dim } else { 0 };
    (tiles + stage) as u32
}
