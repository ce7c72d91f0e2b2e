//! One task of [`paged_attention`](super::paged_attention): a tile of query
//! rows of one sequence against one key/value head, in arithmetic that does
//! not depend on the tile (batch invariance).
//!
//! Every query row is computed the same way, whether it is one of a 64-row
//! prefill tile, of a chunk, or a decode step's lone row:
//! - score `s_j = scale · (q·k_j)`, the dot product an FMA chain over the
//!   head dimension in order (vectorized across [`KEYS`] keys at a time,
//!   from a transposed copy of the keys);
//! - the softmax over the row's visible keys;
//! - output element `o_c = Σ_j p_j · v_j[c]`, an FMA chain over the visible
//!   keys in order (vectorized across the head dimension).
//!
//! So a prompt's logits are bit-identical whether it is prefilled in one
//! step, in chunks, or fed one token at a time. That matters most in fast
//! mode, whose 8-bit activation quantizers turn a last-bit difference into
//! a whole quantization step (measured: up to 0.7 logits on Qwen2.5-0.5B
//! with the tiles computed by a matrix-product library).

use std::ops::Range;

use super::{softmax_visible, AttentionParams, CacheElement, CacheLayout, SequenceRows, SharedOut};

/// Keys scored together: one score vector.
pub(super) const KEYS: usize = 16;
/// Query vectors scored together (they share every key block): `2·QUERIES`
/// accumulators, in AVX-512's 32 registers.
const QUERIES: usize = 8;
/// [`QUERIES`] for AVX2's 16 registers and the portable code.
pub(super) const QUERIES_NARROW: usize = 4;
/// Query heads of a row weighed together (they share every value).
const HEADS: usize = 4;
/// Query rows scored in one pass over the keys.
const PASS_ROWS: usize = 4;
/// Output elements accumulated together.
const LANES: usize = 64;

/// One (sequence, row tile, key/value head) of the attention.
pub(super) struct Task<'a> {
    pub layout: CacheLayout,
    pub num_heads: usize,
    pub params: AttentionParams,
    pub seq: &'a SequenceRows<'a>,
    pub rows: Range<usize>,
    pub kv_head: usize,
    /// Each row sees only positions up to its own.
    pub causal: bool,
}

impl Task<'_> {
    /// Computes the task's rows × the heads of its key/value group into `out`.
    pub fn run<T: CacheElement>(&self, k_cache: &[T], v_cache: &[T], q: &[f32], out: &SharedOut) {
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx512f")]
            unsafe fn avx512<T: CacheElement>(
                task: &Task<'_>,
                k_cache: &[T],
                v_cache: &[T],
                q: &[f32],
                out: &SharedOut,
            ) {
                task.run_inline::<T, true, false>(k_cache, v_cache, q, out);
            }
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn avx2<T: CacheElement>(
                task: &Task<'_>,
                k_cache: &[T],
                v_cache: &[T],
                q: &[f32],
                out: &SharedOut,
            ) {
                task.run_inline::<T, false, true>(k_cache, v_cache, q, out);
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F.
                return unsafe { avx512(self, k_cache, v_cache, q, out) };
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                // SAFETY: the CPU has AVX2, FMA and F16C.
                return unsafe { avx2(self, k_cache, v_cache, q, out) };
            }
        }
        self.run_inline::<T, false, false>(k_cache, v_cache, q, out);
    }

    /// The key positions row `row` (of the sequence's rows) sees.
    fn visible(&self, row: usize) -> Range<usize> {
        if !self.causal {
            return 0..self.seq.context_len;
        }
        let position = self.seq.context_len - self.seq.rows.len() + (row - self.seq.rows.start);
        let from = self
            .params
            .sliding_window
            .map_or(0, |w| (position + 1).saturating_sub(w));
        from..position + 1
    }

    /// The task, with the AVX-512 row kernels when `AVX512` and the AVX2
    /// ones when `AVX2` (the caller checked the CPU has them).
    #[inline(always)]
    fn run_inline<T: CacheElement, const AVX512: bool, const AVX2: bool>(
        &self,
        k_cache: &[T],
        v_cache: &[T],
        q: &[f32],
        out: &SharedOut,
    ) {
        let d = self.layout.head_dim;
        // Every key some row of the tile sees: from the first row's window
        // start to the last row's position.
        let keys = self.visible(self.rows.start).start..self.visible(self.rows.end - 1).end;
        // A task of one pass (a decode step's rows) reads each key and
        // value once: on AVX2, in place, where widened copies would cost
        // more than the products.
        #[cfg(target_arch = "x86_64")]
        if AVX2 && self.rows.len() <= PASS_ROWS && d.is_multiple_of(8) {
            use super::CacheFloats::{Bf16, F16, F32};
            if let (Some(k), Some(v)) = (T::floats(k_cache), T::floats(v_cache)) {
                match (k, v) {
                    (F32(k), F32(v)) => return self.in_place_avx2(k, v, keys, q, out),
                    (F16(k), F16(v)) => return self.in_place_avx2(k, v, keys, q, out),
                    (Bf16(k), Bf16(v)) => return self.in_place_avx2(k, v, keys, q, out),
                    _ => {}
                }
            }
        }
        let (kt, v) = self.widen::<T, AVX512, AVX2>(k_cache, v_cache, keys.clone());
        let widened = Widened::<AVX512, AVX2> { kt: &kt, v: &v, d };
        self.passes(&widened, keys, q, out);
    }

    /// [`Self::passes`] over the cache's keys and values read in place by
    /// the AVX2 kernels (the caller checked the CPU has AVX2, FMA and F16C,
    /// and that heads are a multiple of 8 long).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn in_place_avx2<E: super::avx2::Load8>(
        &self,
        k: &[E],
        v: &[E],
        keys: Range<usize>,
        q: &[f32],
        out: &SharedOut,
    ) {
        let heads = self.key_heads(keys.clone());
        let d = self.layout.head_dim;
        let source = super::avx2::InPlace {
            k,
            v,
            heads: &heads,
            d,
        };
        self.passes(&source, keys, q, out);
    }

    /// The offset in the cache of each of `keys`' head of this task's
    /// key/value head (one division for the first, none after).
    #[cfg(target_arch = "x86_64")]
    fn key_heads(&self, keys: Range<usize>) -> Vec<usize> {
        let (block_size, stride) = (self.layout.block_size, self.layout.position_stride());
        let head = self.kv_head * self.layout.head_dim;
        let mut heads = Vec::with_capacity(keys.len());
        let (mut block, mut slot) = (keys.start / block_size, keys.start % block_size);
        for _ in keys {
            heads.push((self.seq.block_table[block] * block_size + slot) * stride + head);
            slot += 1;
            if slot == block_size {
                (block, slot) = (block + 1, 0);
            }
        }
        heads
    }

    /// The task's rows, [`PASS_ROWS`] at a time: each pass scores its query
    /// vectors (rows × heads of the group) against the keys of `keys`, takes
    /// each one's softmax and weighs the values by it.
    #[inline(always)]
    fn passes<S: KeySource>(&self, source: &S, keys: Range<usize>, q: &[f32], out: &SharedOut) {
        let d = self.layout.head_dim;
        let group = self.num_heads / self.layout.num_kv_heads;
        let row_len = self.num_heads * d;
        let n_keys = keys.len();
        let local = |row: usize| {
            let visible = self.visible(row);
            visible.start - keys.start..visible.end - keys.start
        };
        let mut scores = vec![0f32; PASS_ROWS.min(self.rows.len()) * group * n_keys];
        let mut first_row = self.rows.start;
        while first_row < self.rows.end {
            let rows = first_row..(first_row + PASS_ROWS).min(self.rows.end);
            // The pass's query vectors: (row, head of the group) in order.
            let vectors: Vec<(usize, usize)> = rows
                .clone()
                .flat_map(|row| (0..group).map(move |h| (row, h)))
                .collect();
            let query = |&(row, h): &(usize, usize)| {
                let at = row * row_len + (self.kv_head * group + h) * d;
                &q[at..at + d]
            };
            for (chunk, s) in vectors
                .chunks(S::QUERIES)
                .zip(scores.chunks_mut(S::QUERIES * n_keys))
            {
                let ranges: Vec<Range<usize>> = chunk.iter().map(|&(row, _)| local(row)).collect();
                let qs: Vec<&[f32]> = chunk.iter().map(query).collect();
                let s = &mut s[..chunk.len() * n_keys];
                let scale = self.params.scale;
                match chunk.len() {
                    1 => source.score::<1>(&qs, &ranges, scale, s),
                    2 => source.score::<2>(&qs, &ranges, scale, s),
                    3 => source.score::<3>(&qs, &ranges, scale, s),
                    4 => source.score::<4>(&qs, &ranges, scale, s),
                    5 => source.score::<5>(&qs, &ranges, scale, s),
                    6 => source.score::<6>(&qs, &ranges, scale, s),
                    7 => source.score::<7>(&qs, &ranges, scale, s),
                    _ => source.score::<8>(&qs, &ranges, scale, s),
                }
                for (head, range) in s.chunks_exact_mut(n_keys).zip(ranges) {
                    softmax_visible(&mut head[range], self.params.softcap);
                }
            }
            for (i, row) in rows.clone().enumerate() {
                let local = local(row);
                let at = row * row_len + self.kv_head * group * d;
                assert!(at + group * d <= out.1, "attention output range");
                // SAFETY: this task alone writes its rows × the heads of its
                // key/value group, which lie inside `out` (checked above).
                let o = unsafe { std::slice::from_raw_parts_mut(out.0.add(at), group * d) };
                let p = &scores[i * group * n_keys..(i + 1) * group * n_keys];
                for (p, o) in p.chunks(HEADS * n_keys).zip(o.chunks_mut(HEADS * d)) {
                    match o.len() / d {
                        1 => source.weigh::<1>(p, &local, o),
                        2 => source.weigh::<2>(p, &local, o),
                        3 => source.weigh::<3>(p, &local, o),
                        _ => source.weigh::<4>(p, &local, o),
                    }
                }
            }
            first_row = rows.end;
        }
    }

    /// The keys at `keys` widened to f32 and transposed in blocks of
    /// [`KEYS`] (`[block][d][KEYS]`, the last block zero-padded), and the
    /// values widened (`[key][d]`).
    #[inline(always)]
    fn widen<T: CacheElement, const AVX512: bool, const AVX2: bool>(
        &self,
        k_cache: &[T],
        v_cache: &[T],
        keys: Range<usize>,
    ) -> (Vec<f32>, Vec<f32>) {
        let d = self.layout.head_dim;
        let mut kt = vec![0f32; keys.len().div_ceil(KEYS) * KEYS * d];
        let mut v = vec![0f32; keys.len() * d];
        // A block's keys, one per row.
        let mut block_keys = vec![0f32; KEYS * d];
        for (b, first_key) in keys.clone().step_by(KEYS).enumerate() {
            let block = first_key..(first_key + KEYS).min(keys.end);
            for (lane, position) in block.clone().enumerate() {
                let at = self.layout.offset(self.seq.block_table, position) + self.kv_head * d;
                let j = b * KEYS + lane;
                let cached = super::elements::<T>(at, d);
                load::<T, AVX512, AVX2>(
                    &k_cache[cached.clone()],
                    &mut block_keys[lane * d..(lane + 1) * d],
                );
                load::<T, AVX512, AVX2>(&v_cache[cached], &mut v[j * d..(j + 1) * d]);
            }
            block_keys[block.len() * d..].fill(0.0);
            let out = &mut kt[b * KEYS * d..(b + 1) * KEYS * d];
            let mut first = 0;
            #[cfg(target_arch = "x86_64")]
            if AVX512 {
                while first + KEYS <= d {
                    let columns = &mut out[first * KEYS..(first + KEYS) * KEYS];
                    // SAFETY: `AVX512` is set only on CPUs with AVX-512F;
                    // `block_keys` holds 16 rows of d ≥ first + 16 floats.
                    unsafe { super::avx512::transpose16(&block_keys, d, first, columns) };
                    first += KEYS;
                }
            }
            #[cfg(target_arch = "x86_64")]
            if AVX2 {
                while first + 8 <= d {
                    let columns = &mut out[first * KEYS..(first + 8) * KEYS];
                    // SAFETY: `AVX2` is set only on CPUs with AVX2;
                    // `block_keys` holds 16 rows of d ≥ first + 8 floats.
                    unsafe { super::avx2::transpose16x8(&block_keys, d, first, columns) };
                    first += 8;
                }
            }
            for c in first..d {
                for lane in 0..KEYS {
                    out[c * KEYS + lane] = block_keys[lane * d + c];
                }
            }
        }
        (kt, v)
    }
}

/// Where a task's passes read its keys and values: scores of `Q` query
/// vectors (local key ranges, `scores` `[Q, n_keys]`) and the weighing of
/// `H` heads' values (`p` `[H, n_keys]`, `out` `[H, d]`), each the portable
/// [`score`] and [`weigh`]'s FMA chains.
pub(super) trait KeySource {
    /// Query vectors scored together.
    const QUERIES: usize;
    /// [`score`] over this source's keys.
    fn score<const Q: usize>(
        &self,
        q: &[&[f32]],
        ranges: &[Range<usize>],
        scale: f32,
        scores: &mut [f32],
    );
    /// [`weigh`] over this source's values.
    fn weigh<const H: usize>(&self, p: &[f32], local: &Range<usize>, out: &mut [f32]);
}

/// The keys widened and transposed, the values widened ([`Task::widen`]),
/// read by the AVX-512 kernels when `AVX512`, the AVX2 ones when `AVX2`.
struct Widened<'a, const AVX512: bool, const AVX2: bool> {
    kt: &'a [f32],
    v: &'a [f32],
    d: usize,
}

impl<const AVX512: bool, const AVX2: bool> KeySource for Widened<'_, AVX512, AVX2> {
    const QUERIES: usize = if AVX512 { QUERIES } else { QUERIES_NARROW };

    #[inline(always)]
    fn score<const Q: usize>(
        &self,
        q: &[&[f32]],
        ranges: &[Range<usize>],
        scale: f32,
        scores: &mut [f32],
    ) {
        score_on::<Q, AVX512, AVX2>(q, self.kt, self.d, ranges, scale, scores);
    }

    #[inline(always)]
    fn weigh<const H: usize>(&self, p: &[f32], local: &Range<usize>, out: &mut [f32]) {
        weigh_on::<H, AVX512, AVX2>(p, self.v, self.d, local, out);
    }
}

/// [`CacheElement::load`], with AVX-512 code when `AVX512` and AVX2 code
/// when `AVX2` (the caller checked the CPU has them).
#[inline(always)]
fn load<T: CacheElement, const AVX512: bool, const AVX2: bool>(src: &[T], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if AVX512 {
        // SAFETY: `AVX512` is set only on CPUs with AVX-512F.
        return unsafe { T::load_avx512(src, dst) };
    }
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: `AVX2` is set only on CPUs with AVX2 and F16C.
        return unsafe { T::load_avx2(src, dst) };
    }
    T::load(src, dst);
}

/// The blocks of [`KEYS`] keys that cover every one of `ranges`.
pub(super) fn key_blocks(ranges: &[Range<usize>]) -> Range<usize> {
    let from = ranges.iter().map(|r| r.start).min().unwrap_or(0);
    let to = ranges.iter().map(|r| r.end).max().unwrap_or(0);
    from / KEYS..to.div_ceil(KEYS)
}

/// [`score`], on AVX-512 when `AVX512` and on AVX2 when `AVX2`.
#[inline(always)]
fn score_on<const Q: usize, const AVX512: bool, const AVX2: bool>(
    q: &[&[f32]],
    kt: &[f32],
    d: usize,
    ranges: &[Range<usize>],
    scale: f32,
    scores: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if AVX512 {
        // SAFETY: `AVX512` is set only on CPUs with AVX-512F; the sizes are
        // those `score` takes.
        return unsafe { super::avx512::score::<Q>(q, kt, d, ranges, scale, scores) };
    }
    #[cfg(target_arch = "x86_64")]
    if AVX2 && Q <= QUERIES_NARROW {
        // SAFETY: `AVX2` is set only on CPUs with AVX2 and FMA; the sizes
        // are those `score` takes.
        return unsafe { super::avx2::score::<Q>(q, kt, d, ranges, scale, scores) };
    }
    score::<Q>(q, kt, d, ranges, scale, scores);
}

/// [`weigh`], on AVX-512 when `AVX512` and on AVX2 when `AVX2`.
#[inline(always)]
fn weigh_on<const H: usize, const AVX512: bool, const AVX2: bool>(
    p: &[f32],
    v: &[f32],
    d: usize,
    local: &Range<usize>,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if AVX512 {
        // SAFETY: as for `score_on`.
        return unsafe { super::avx512::weigh::<H>(p, v, d, local, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        assert!(v.len() >= p.len() / H * d, "weigh sizes");
        // SAFETY: as for `score_on`; the values hold every key's row.
        return unsafe { super::avx2::weigh::<f32, H>(p, v, |j| j * d, d, local, out) };
    }
    weigh::<H>(p, v, d, local, out);
}

/// `scores[i][j] = scale · (q_i · k_j)` for the `Q` query vectors `q`
/// (each `d` long) and, for each, the keys `ranges[i]` of `kt` (as
/// [`Task::widen`] lays them out); `scores` is `[Q, n_keys]`, written only
/// at each vector's range. Two key blocks at a time, so that `2·Q` FMA
/// chains are in flight.
#[inline(always)]
pub(super) fn score<const Q: usize>(
    q: &[&[f32]],
    kt: &[f32],
    d: usize,
    ranges: &[Range<usize>],
    scale: f32,
    scores: &mut [f32],
) {
    let n_keys = scores.len() / Q;
    let q: [&[f32]; Q] = std::array::from_fn(|i| &q[i][..d]);
    let Range {
        start: from,
        end: to,
    } = key_blocks(ranges);
    let mut block = from;
    while block < to {
        let pair = block + 1 < to;
        let span = if pair { 2 * KEYS * d } else { KEYS * d };
        let keys = &kt[block * KEYS * d..block * KEYS * d + span];
        let mut acc = [[[0f32; KEYS]; 2]; Q];
        if pair {
            let (k0, k1) = keys.split_at(KEYS * d);
            for (c, (k0, k1)) in k0.chunks_exact(KEYS).zip(k1.chunks_exact(KEYS)).enumerate() {
                for i in 0..Q {
                    let x = q[i][c];
                    for l in 0..KEYS {
                        acc[i][0][l] = x.mul_add(k0[l], acc[i][0][l]);
                        acc[i][1][l] = x.mul_add(k1[l], acc[i][1][l]);
                    }
                }
            }
        } else {
            for (c, k0) in keys.chunks_exact(KEYS).enumerate() {
                for i in 0..Q {
                    let x = q[i][c];
                    for l in 0..KEYS {
                        acc[i][0][l] = x.mul_add(k0[l], acc[i][0][l]);
                    }
                }
            }
        }
        let blocks = if pair { 2 } else { 1 };
        let lanes = block * KEYS..(block + blocks) * KEYS;
        for (i, range) in ranges.iter().enumerate() {
            let live = lanes.start.max(range.start)..lanes.end.min(range.end);
            for j in live {
                let b = (j - lanes.start) / KEYS;
                scores[i * n_keys + j] = scale * acc[i][b][j % KEYS];
            }
        }
        block += blocks;
    }
}

/// `out[h] = Σ_{j ∈ local} p[h][j] · v_j` for `H` heads (`p` is `[H,
/// n_keys]`, `v` `[n_keys, d]`, `out` `[H, d]`).
#[inline(always)]
pub(super) fn weigh<const H: usize>(
    p: &[f32],
    v: &[f32],
    d: usize,
    local: &Range<usize>,
    out: &mut [f32],
) {
    let n_keys = p.len() / H;
    let mut first = 0;
    while first < d {
        let width = LANES.min(d - first);
        let mut acc = [[0f32; LANES]; H];
        for j in local.clone() {
            let v = &v[j * d + first..j * d + first + width];
            for h in 0..H {
                let p = p[h * n_keys + j];
                for (a, &x) in acc[h][..width].iter_mut().zip(v) {
                    *a = p.mul_add(x, *a);
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            out[h * d + first..h * d + first + width].copy_from_slice(&acc[..width]);
        }
        first += width;
    }
}
