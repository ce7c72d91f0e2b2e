//! Paged attention's launches: the KV-cache write (alone, or with the
//! rotary embedding of q and k in one launch, as `plan.rs` pairs them),
//! then attention on tensor cores (prefill over a bf16 or fp8 cache) or on
//! CUDA cores (a block per key/value head and its group of query heads where
//! the head allows, else per query head), split-K (flash-decoding) for few
//! rows over long contexts. Each kernel comes in one entry point per
//! [`KvElement`].

use kiln_kernels::cuda::{flash, float_pair_word, DevicePtr, KernelArg, LaunchConfig};
use kiln_plugin_api::graph::{AttentionSpec, ValueId};

use super::gemv::GemvRotation;
use super::launch::{numel, row_threads, Frame};
use super::plan::{CacheWrite, GroupRotation, HeadNorms, RotatingGroup};
use super::products::{out_type_arg, rotates_after_stack};
use super::DeviceKvCache;
use crate::compiler::Step;

/// What the KV cache's elements are on the device (numbered as
/// `KILN_CACHE_*` in `kiln_cuda.cuh`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvElement {
    #[default]
    F32 = 0,
    Bf16 = 1,
    /// E4M3 (`fp8_e4m3` in `kiln_cuda.cuh`).
    Fp8 = 2,
}

impl KvElement {
    /// Bytes an element.
    pub fn bytes(self) -> usize {
        match self {
            KvElement::F32 => 4,
            KvElement::Bf16 => 2,
            KvElement::Fp8 => 1,
        }
    }

    /// The cache write's kernel: alone, or with the rotary embedding.
    fn write_kernel(self, with_rope: bool) -> &'static str {
        match (self, with_rope) {
            (KvElement::F32, false) => "kiln_write_kv",
            (KvElement::Bf16, false) => "kiln_write_kv_bf16",
            (KvElement::Fp8, false) => "kiln_write_kv_fp8",
            (KvElement::F32, true) => "kiln_rope_write_kv",
            (KvElement::Bf16, true) => "kiln_rope_write_kv_bf16",
            (KvElement::Fp8, true) => "kiln_rope_write_kv_fp8",
        }
    }

    /// The per-query-head paged-attention kernel, for heads up to
    /// [`HEAD_DIM`] or (`wide`) [`WIDE_HEAD_DIM`].
    fn paged_kernel(self, wide: bool) -> &'static str {
        match (self, wide) {
            (KvElement::F32, false) => "kiln_paged_attention",
            (KvElement::Bf16, false) => "kiln_paged_attention_bf16",
            (KvElement::Fp8, false) => "kiln_paged_attention_fp8",
            (KvElement::F32, true) => "kiln_paged_attention_wide",
            (KvElement::Bf16, true) => "kiln_paged_attention_wide_bf16",
            (KvElement::Fp8, true) => "kiln_paged_attention_wide_fp8",
        }
    }
}

/// Where a rotation writes the keys and values of a layer: its caches and
/// the batch description (the cache-write arguments of `kiln_rope_write_kv`
/// and of the rotated GEMV; all zero for none).
#[derive(Clone, Copy, Debug, Default)]
pub struct CacheTarget {
    pub k_cache: DevicePtr,
    pub v_cache: DevicePtr,
    pub row_offsets: DevicePtr,
    pub context_lens: DevicePtr,
    pub block_tables: DevicePtr,
    /// Sequences, block-table width, positions per cache block.
    pub batch: usize,
    pub blocks_per_seq: usize,
    pub block_size: usize,
    /// What the cache holds.
    pub element: KvElement,
}

/// One rotary launch: `x` → `y` ([tokens, heads, 2 · half]) and a second
/// tensor at the same positions, `(x2, y2, heads2)` (zeros for none), their
/// inputs' token rows `in_stride` values apart (0: dense); with `write`,
/// the cache write of the rotated keys and of `v` to the target.
struct RopeLaunch {
    x: DevicePtr,
    positions: DevicePtr,
    inv_freq: DevicePtr,
    y: DevicePtr,
    heads: usize,
    half: usize,
    interleaved: bool,
    scale: f32,
    second: (DevicePtr, DevicePtr, usize),
    in_stride: usize,
    /// `KilnHeadNorms` (rope.cu): the weights of q's and k's heads, epsilon
    /// and offset.
    norms: Option<(DevicePtr, DevicePtr, f32, f32)>,
    tokens: usize,
    write: Option<(DevicePtr, CacheTarget)>,
}

impl Frame<'_> {
    /// Rotary embedding of q (and of k in the same launch, `with`); with
    /// `cache_write`, the launch also writes the rotated keys and the
    /// values into the layer's paged cache (`kiln_rope_write_kv`), which
    /// the attention step then skips. Nothing when the product of q, k and
    /// v did it (`in_group`: as the decode GEMV, or after its stacked GEMM).
    /// With `head_norms`, q and k are read before their norms, which the
    /// launch takes.
    pub(super) fn rope(
        &self,
        step: &Step,
        (interleaved, scale): (bool, f32),
        with: Option<(ValueId, ValueId)>,
        (cache_write, in_group): (Option<CacheWrite>, Option<RotatingGroup>),
        head_norms: Option<HeadNorms>,
    ) -> Result<(), String> {
        let addr = |v: ValueId| self.addrs[v as usize];
        let (tokens, heads, dim) = match self.shapes[step.output as usize].as_slice() {
            [t, h, d] => (*t, *h, *d),
            other => return Err(format!("rope expects [T, H, D], got {other:?}")),
        };
        // The group (q, k and v) rotates by its matrices and rows alone, as
        // `product_group` decides.
        let in_product =
            |g: RotatingGroup| g.gemv.kernel(tokens).is_some() || rotates_after_stack(&g, tokens);
        if in_group.is_some_and(in_product) {
            return Ok(()); // rotated (and cached) by the product
        }
        if tokens == 0 {
            return Ok(());
        }
        // The second tensor rotated in the same launch, if any.
        let (x2, y2, heads2) = match with {
            Some((x2, y2)) => (
                addr(x2),
                addr(y2),
                self.shapes[y2 as usize].get(1).copied().unwrap_or(0),
            ),
            None => (0, 0, 0),
        };
        let write = match cache_write {
            Some(write) if with.is_some() => {
                Some((addr(write.v), self.cache_target(write, heads2, dim)?))
            }
            Some(_) => return Err("the cache write needs the keys' rotation".into()),
            None => None,
        };
        let (x, x2) = match head_norms {
            Some(n) => (addr(n.q_in), addr(n.k_in)),
            None => (addr(step.inputs[0]), x2),
        };
        let norms = head_norms.map(|n| (addr(n.q.weight), addr(n.k.weight), n.q.eps, n.q.offset));
        self.launch_rope(&RopeLaunch {
            x,
            positions: addr(step.inputs[1]),
            inv_freq: addr(step.inputs[2]),
            y: addr(step.output),
            heads,
            half: dim / 2,
            interleaved,
            scale,
            second: (x2, y2, heads2),
            in_stride: 0,
            norms,
            tokens,
            write,
        })
    }

    /// Rotates q and k, writing the cache (`rotation`'s), from the rows of
    /// `tokens` of q, k and v's stacked product at `y` ([tokens, q_width +
    /// 2 · kv_width], `products::rotates_after_stack`; v's own value is not
    /// written: only the attention, which reads the cache, reads it).
    pub(super) fn rope_after_stack(
        &self,
        rotation: &GemvRotation,
        (y, tokens): (DevicePtr, usize),
        (q_width, kv_width): (usize, usize),
    ) -> Result<(), String> {
        let dim = 2 * rotation.half;
        let cache = rotation
            .cache
            .ok_or("a rotation after the stacked product of q, k and v writes the cache")?;
        let at = |values: usize| y + (values * 4) as DevicePtr;
        self.launch_rope(&RopeLaunch {
            x: y,
            positions: rotation.positions,
            inv_freq: rotation.inv_freq,
            y: rotation.q_out,
            heads: q_width / dim,
            half: rotation.half,
            interleaved: rotation.interleaved,
            scale: rotation.scale,
            second: (at(q_width), rotation.k_out, kv_width / dim),
            in_stride: q_width + 2 * kv_width,
            norms: None,
            tokens,
            write: Some((at(q_width + kv_width), cache)),
        })
    }

    /// `kiln_rope`, or with a cache write `kiln_rope_write_kv` (rope.cu).
    fn launch_rope(&self, r: &RopeLaunch) -> Result<(), String> {
        if r.tokens == 0 {
            return Ok(());
        }
        let (x2, y2, heads2) = r.second;
        let mut args = vec![
            KernelArg::Ptr(r.x),
            KernelArg::Ptr(r.positions),
            KernelArg::Ptr(r.inv_freq),
            KernelArg::Ptr(r.y),
            KernelArg::I32(r.heads as i32),
            KernelArg::I32(r.half as i32),
            KernelArg::I32(i32::from(r.interleaved)),
            KernelArg::F32(r.scale),
            KernelArg::Ptr(x2),
            KernelArg::Ptr(y2),
            KernelArg::I32(heads2 as i32),
            KernelArg::I32(r.in_stride as i32),
            KernelArg::Struct(match r.norms {
                Some((w, w2, eps, offset)) => vec![w, w2, float_pair_word(eps, offset)],
                None => vec![0; 3],
            }),
        ];
        let rotations = (r.heads + heads2) * r.half;
        let Some((v, target)) = r.write else {
            let config = rope_config(r.tokens, rotations);
            return self.launch("kiln_rope", config, &args);
        };
        args.extend([
            KernelArg::Ptr(v),
            KernelArg::Ptr(target.k_cache),
            KernelArg::Ptr(target.v_cache),
            KernelArg::Ptr(target.row_offsets),
            KernelArg::Ptr(target.context_lens),
            KernelArg::Ptr(target.block_tables),
            KernelArg::I32(target.batch as i32),
            KernelArg::I32(target.blocks_per_seq as i32),
            KernelArg::I32(target.block_size as i32),
        ]);
        let name = target.element.write_kernel(true);
        let config = rope_config(r.tokens, rotations.max(heads2 * 2 * r.half));
        self.launch(name, config, &args)
    }

    /// The layer's caches and the batch description a cache write of keys
    /// and values of `kv_heads` heads of `head_dim` goes to.
    fn cache_target(
        &self,
        write: CacheWrite,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<CacheTarget, String> {
        let cache = self.cache.ok_or("paged attention needs a KV cache")?;
        check_cache_heads(cache, kv_heads, head_dim)?;
        let (k_cache, v_cache) = cache
            .layer(write.layer as usize)
            .ok_or_else(|| format!("the cache has no layer {}", write.layer))?;
        let [row_offsets, context_lens, block_tables] = write.batch;
        Ok(CacheTarget {
            k_cache,
            v_cache,
            row_offsets: self.addrs[row_offsets as usize],
            context_lens: self.addrs[context_lens as usize],
            block_tables: self.addrs[block_tables as usize],
            batch: numel(&self.shapes[context_lens as usize]),
            blocks_per_seq: self.shapes[block_tables as usize]
                .get(1)
                .copied()
                .unwrap_or(0),
            block_size: cache.layout.block_size,
            element: cache.element,
        })
    }

    /// The rotation (and cache write) the GEMV of q, k and v applies as it
    /// writes them (see [`GroupRotation`]).
    pub(super) fn gemv_rotation(&self, r: &GroupRotation) -> Result<GemvRotation, String> {
        let addr = |v: ValueId| self.addrs[v as usize];
        let (kv_heads, head_dim) = match self.shapes[r.k_out as usize].as_slice() {
            [_, h, d] => (*h, *d),
            other => return Err(format!("rope expects [T, H, D], got {other:?}")),
        };
        let cache = r
            .cache_write
            .map(|write| self.cache_target(write, kv_heads, head_dim))
            .transpose()?;
        Ok(GemvRotation {
            positions: addr(r.positions),
            inv_freq: addr(r.inv_freq),
            q_out: addr(r.q_out),
            k_out: addr(r.k_out),
            scale: r.scale,
            half: head_dim / 2,
            interleaved: r.interleaved,
            cache,
            stacked: r.stacked,
        })
    }

    /// Paged attention: the step's keys and values written into the cache
    /// (unless `cache_written`: its rotary launch did), then attention on
    /// tensor cores for prefill or the CUDA-core kernels, split-K for few
    /// rows over long contexts.
    pub(super) fn attention(
        &self,
        step: &Step,
        spec: &AttentionSpec,
        cache_written: bool,
        scratch: Option<DevicePtr>,
    ) -> Result<(), String> {
        let cache = self.cache.ok_or("paged attention needs a KV cache")?;
        let addr = |i: usize| self.addrs[step.inputs[i] as usize];
        let shape = |i: usize| &self.shapes[step.inputs[i] as usize];
        let (tokens, num_heads, head_dim) = match shape(0).as_slice() {
            [t, h, d] => (*t, *h, *d),
            other => return Err(format!("q must be [T, H, D], got {other:?}")),
        };
        let kv_heads = shape(1)[1];
        let layout = cache.layout;
        check_cache_heads(cache, kv_heads, head_dim)?;
        if head_dim > WIDE_HEAD_DIM || num_heads % kv_heads != 0 {
            return Err(format!(
                "{num_heads} query heads over {kv_heads} key/value heads of {head_dim} are not \
                 supported (head_dim ≤ {WIDE_HEAD_DIM})"
            ));
        }
        if tokens == 0 {
            return Ok(());
        }
        let (k_cache, v_cache) = cache
            .layer(spec.layer as usize)
            .ok_or_else(|| format!("the cache has no layer {}", spec.layer))?;
        let batch = numel(shape(4));
        let blocks_per_seq = shape(5).get(1).copied().unwrap_or(0);
        let stride = kv_heads * head_dim;
        let metadata = [
            KernelArg::Ptr(addr(3)),
            KernelArg::Ptr(addr(4)),
            KernelArg::Ptr(addr(5)),
            KernelArg::I32(batch as i32),
            KernelArg::I32(blocks_per_seq as i32),
            KernelArg::I32(layout.block_size as i32),
        ];
        let mut args = vec![
            KernelArg::Ptr(addr(1)),
            KernelArg::Ptr(addr(2)),
            KernelArg::Ptr(k_cache),
            KernelArg::Ptr(v_cache),
        ];
        args.extend(metadata.iter().cloned());
        args.push(KernelArg::I32(stride as i32));
        let element = cache.element;
        if !cache_written {
            let config = LaunchConfig::linear(tokens as u32, row_threads(stride));
            self.launch(element.write_kernel(false), config, &args)?;
        }
        let mut args = vec![
            KernelArg::Ptr(addr(0)),
            KernelArg::Ptr(k_cache),
            KernelArg::Ptr(v_cache),
            KernelArg::Ptr(self.addrs[step.output as usize]),
        ];
        args.extend(metadata);
        args.extend([
            KernelArg::I32(num_heads as i32),
            KernelArg::I32(kv_heads as i32),
        ]);
        let window = KernelArg::I32(spec.sliding_window.map_or(0, |w| w as i32));
        let softcap = KernelArg::F32(spec.softcap.unwrap_or(0.0));
        // The output's type: f32, or the half type of the output projection
        // reading it (fusion.rs, `half_product_inputs`).
        let out_type = out_type_arg(self.stored_half(step.output));
        let flash = flash_kernel(element, head_dim)
            .filter(|_| self.flash_attention && tokens >= FLASH_ROWS_PER_SEQUENCE * batch);
        if let Some(flash) = flash {
            args.extend([KernelArg::F32(spec.scale), window, softcap, out_type]);
            let tiles = tokens.div_ceil(flash::ROWS) + batch;
            let config = LaunchConfig {
                shared_bytes: flash::shared_bytes(head_dim, element.bytes()),
                ..LaunchConfig::new((num_heads as u32, tiles as u32, 1), (flash::THREADS, 1, 1))
            };
            return self.launch(flash, config, &args);
        }
        args.extend([
            KernelArg::I32(head_dim as i32),
            KernelArg::F32(spec.scale),
            window,
            softcap,
        ]);
        let tensor_cores =
            decode_kernel(element, num_heads, kv_heads, head_dim).filter(|_| self.flash_attention);
        let grouped = grouped_kernel(element, num_heads, kv_heads, head_dim);
        let (attend, blocks_per_row) = match (tensor_cores, grouped) {
            (Some(name), _) => (name, kv_heads),
            (None, Some((name, group))) => {
                (name, kv_heads * (num_heads / kv_heads).div_ceil(group))
            }
            (None, None) => (element.paged_kernel(head_dim > HEAD_DIM), num_heads),
        };
        let whole_rounds = tensor_cores.is_some() && !self.short_attention_splits;
        let splits = launch_splits(
            (tokens, blocks_per_row),
            (blocks_per_seq, layout.block_size),
            whole_rounds,
        );
        let split_keys = blocks_per_seq.div_ceil(splits) * layout.block_size;
        // Split: the partial results go to scratch, and the last block of
        // each (row, block of heads) to finish merges them.
        let (partials, counters) = match splits {
            1 => (0, 0),
            _ => (
                scratch.ok_or("no scratch planned for split attention")?,
                self.split_counters,
            ),
        };
        args.extend([
            KernelArg::I32(split_keys as i32),
            KernelArg::Ptr(partials),
            KernelArg::Ptr(counters),
            out_type,
        ]);
        let grid = (tokens as u32, blocks_per_row as u32, splits as u32);
        self.launch(attend, LaunchConfig::new(grid, (128, 1, 1)), &args)
    }
}

/// Fails unless the cache holds `kv_heads` heads of `head_dim` values.
fn check_cache_heads(
    cache: &DeviceKvCache,
    kv_heads: usize,
    head_dim: usize,
) -> Result<(), String> {
    let layout = cache.layout;
    if kv_heads != layout.num_kv_heads || head_dim != layout.head_dim {
        return Err(format!(
            "k is [.., {kv_heads}, {head_dim}] but the cache holds {} heads of {}",
            layout.num_kv_heads, layout.head_dim
        ));
    }
    Ok(())
}

/// The largest head of the attention kernels (`attention.cu`).
pub(super) const HEAD_DIM: usize = 256;
/// The largest head of the `_wide` paged-attention kernels (DeepSeek's
/// latent head, 512 + 64).
const WIDE_HEAD_DIM: usize = 576;

/// Rows per sequence, on average over a step, from which attention runs on
/// tensor cores (`flash_attention.cu`): the kernel computes 32 rows per
/// warp, so a decode row (or a few) would waste most of each product.
const FLASH_ROWS_PER_SEQUENCE: usize = 16;

/// The tensor-core attention kernel for a cache of `element` and
/// `head_dim`, where there is one (bf16 and fp8 caches).
fn flash_kernel(element: KvElement, head_dim: usize) -> Option<&'static str> {
    Some(match (element, head_dim) {
        (KvElement::Bf16, 64) => "kiln_flash_attention_bf16_d64",
        (KvElement::Bf16, 96) => "kiln_flash_attention_bf16_d96",
        (KvElement::Bf16, 128) => "kiln_flash_attention_bf16_d128",
        (KvElement::Fp8, 64) => "kiln_flash_attention_fp8_d64",
        (KvElement::Fp8, 96) => "kiln_flash_attention_fp8_d96",
        (KvElement::Fp8, 128) => "kiln_flash_attention_fp8_d128",
        _ => return None,
    })
}

/// The tensor-core kernel for rows one at a time (`decode_attention.cu`),
/// where there is one: a bf16 or fp8 cache, heads of 64, 128 or 256 values
/// (Gemma's), at most 8 query heads a key/value head (the rows of its
/// products). Its loop issues ~350 instructions a warp for 16 keys of
/// 128 values (sm_90 SASS), the grouped kernel's ~2,300: at 64 decode rows
/// of Llama-3-8B the CUDA-core kernel was bound by issue (57.8 µs a layer on
/// the H200 for ~42 MB of cache), this one takes 27.2 µs
/// (`bench/results/gpu-2026-11-30b`; ~10 µs at the copy rate).
fn decode_kernel(
    element: KvElement,
    num_heads: usize,
    kv_heads: usize,
    head_dim: usize,
) -> Option<&'static str> {
    if num_heads / kv_heads > 8 {
        return None;
    }
    Some(match (element, head_dim) {
        (KvElement::Bf16, 64) => "kiln_decode_attention_bf16_d64",
        (KvElement::Bf16, 128) => "kiln_decode_attention_bf16_d128",
        (KvElement::Bf16, 256) => "kiln_decode_attention_bf16_d256",
        (KvElement::Fp8, 64) => "kiln_decode_attention_fp8_d64",
        (KvElement::Fp8, 128) => "kiln_decode_attention_fp8_d128",
        (KvElement::Fp8, 256) => "kiln_decode_attention_fp8_d256",
        _ => return None,
    })
}

/// The grouped-query kernel (`attention.cu`'s `grouped_attention`) and the
/// query heads a block of it takes, for heads of a multiple of 8 values up
/// to 256 (16-byte loads of 8 values a lane); other heads take the
/// per-query-head kernels.
fn grouped_kernel(
    element: KvElement,
    num_heads: usize,
    kv_heads: usize,
    head_dim: usize,
) -> Option<(&'static str, usize)> {
    if !head_dim.is_multiple_of(8) || head_dim > HEAD_DIM {
        return None;
    }
    let group = match num_heads / kv_heads {
        1 => 1,
        2 => 2,
        _ => 4,
    };
    Some(match (group, element) {
        (1, KvElement::F32) => ("kiln_grouped_attention_g1", 1),
        (1, KvElement::Bf16) => ("kiln_grouped_attention_g1_bf16", 1),
        (1, KvElement::Fp8) => ("kiln_grouped_attention_g1_fp8", 1),
        (2, KvElement::F32) => ("kiln_grouped_attention_g2", 2),
        (2, KvElement::Bf16) => ("kiln_grouped_attention_g2_bf16", 2),
        (2, KvElement::Fp8) => ("kiln_grouped_attention_g2_fp8", 2),
        (_, KvElement::F32) => ("kiln_grouped_attention_g4", 4),
        (_, KvElement::Bf16) => ("kiln_grouped_attention_g4_bf16", 4),
        (_, KvElement::Fp8) => ("kiln_grouped_attention_g4_fp8", 4),
    })
}

/// The rotary launch of `tokens` rows of `work` (head, pair)s or cached
/// values each: a block per row and stretch of up to [`ROPE_THREADS`] of
/// them, as many stretches as a row has while the launch stays within one
/// wave ([`ROPE_WAVE`]). At 64 decode rows of Llama-3-8B a block a row took
/// 9.8 µs a layer on the H200, its 2,560 rotations in three rounds behind a
/// chain of dependent loads, on 64 of 132 multiprocessors; three blocks of
/// 1024 a row, 9.1 µs; a 2048-token prefill's block of 1024 a token, one an
/// SM, 86.7 µs (`bench/results/gpu-2026-11-30b`).
fn rope_config(tokens: usize, work: usize) -> LaunchConfig {
    let threads = row_threads(work).min(ROPE_THREADS);
    let stretches = work.div_ceil(threads as usize);
    let splits = stretches.min(ROPE_WAVE / tokens.max(1)).max(1);
    LaunchConfig::new((tokens as u32, splits as u32, 1), (threads, 1, 1))
}

/// Threads of a rotary block at most (`KILN_ROPE_THREADS` in rope.cu, its
/// kernels' launch bound).
const ROPE_THREADS: u32 = 256;
/// Rotary blocks an H100's or H200's 132 multiprocessors hold at once, four
/// each.
const ROPE_WAVE: usize = 4 * 132;

/// Rows of a step up to which attention splits each row's keys to fill the
/// GPU (decode batches; more rows split only long contexts, to even out the
/// launch's waves: [`long_context_splits`]).
const SPLIT_ATTENTION_ROWS: usize = 16;
/// Cache blocks per split where a row's keys are many (4 blocks of 16
/// positions: 64 keys, four rounds of a block's 16 keys at a time).
const BLOCKS_PER_SPLIT: usize = 4;
/// Blocks a split launch aims for where the rows' keys are few: two waves
/// of an H100's or H200's 132 multiprocessors. On the H200 a batch-1
/// Llama-3-8B step at ~200 positions split four ways (eight blocks of
/// heads a row, 32 blocks in all) took 31.6 µs a layer under Nsight Compute
/// (`bench/results/gpu-2026-11-30`): a tenth of the step; split 16 ways on
/// tensor cores, 38.6 µs, its last block merging the splits by a chain of
/// dependent L2 loads (since a few rounds of loads for all of them:
/// `merge_head_splits` in paged_attention.cuh; unmeasured).
const TARGET_BLOCKS: usize = 264;
/// Keys a block of the tensor-core decode kernel takes in one round: its
/// four warps' chunks of 16 (`KILN_DECODE_WARPS` and `KILN_DECODE_KEYS` in
/// decode_attention.cu).
const DECODE_ROUND_KEYS: usize = 64;

/// The most splits of a row's keys (tables `blocks_per_seq` wide, cache
/// blocks of `block_size` positions) that leave each block of the
/// tensor-core decode kernel at least a round of keys. A split of less
/// leaves warps idle (a split of one cache block, as [`TARGET_BLOCKS`]
/// asks of short contexts, three of the four) and adds partial results
/// for the merge, where its keys' loads take one memory round trip either
/// way: at batch 1 over ~200 positions (tables 16 wide) all of a layer's
/// keys and values are in flight at once in 32 blocks as in 128.
fn whole_round_splits(blocks_per_seq: usize, block_size: usize) -> usize {
    (blocks_per_seq * block_size / DECODE_ROUND_KEYS).max(1)
}

/// The splits of a launch of `tokens` rows of `blocks_per_row` blocks of
/// heads over tables `blocks_per_seq` wide of cache blocks of `block_size`:
/// [`attention_splits`], at most [`whole_round_splits`] where
/// `whole_rounds` (the tensor-core decode kernel's).
fn launch_splits(
    (tokens, blocks_per_row): (usize, usize),
    (blocks_per_seq, block_size): (usize, usize),
    whole_rounds: bool,
) -> usize {
    let splits = attention_splits(tokens, blocks_per_row, blocks_per_seq);
    if whole_rounds {
        splits.min(whole_round_splits(blocks_per_seq, block_size))
    } else {
        splits
    }
}

/// Splits per row at most (`KILN_MAX_SPLITS` in paged_attention.cuh, what the
/// merge of the splits takes, is more).
const MAX_SPLITS: usize = 32;

/// How many parts attention splits each row's keys into, for a step of
/// `tokens` rows of `blocks_per_row` blocks of heads each over block tables
/// `blocks_per_seq` wide (flash-decoding: few rows would leave most of the
/// GPU idle): a split of [`BLOCKS_PER_SPLIT`] cache blocks, or more splits
/// (down to one cache block each) where those leave the launch under
/// [`TARGET_BLOCKS`].
fn attention_splits(tokens: usize, blocks_per_row: usize, blocks_per_seq: usize) -> usize {
    if tokens > SPLIT_ATTENTION_ROWS {
        return long_context_splits(tokens, blocks_per_row, blocks_per_seq);
    }
    let long = blocks_per_seq.div_ceil(BLOCKS_PER_SPLIT);
    let filling = TARGET_BLOCKS.div_ceil(tokens * blocks_per_row.max(1));
    long.max(filling).min(blocks_per_seq).clamp(1, MAX_SPLITS)
}

/// Rows of a step up to which long contexts split (decode batches up to
/// `--max-num-seqs`' default; scratch for the partial results grows with
/// the rows).
const LONG_SPLIT_ROWS: usize = 256;
/// Cache blocks a split keeps at least past [`SPLIT_ATTENTION_ROWS`] rows:
/// 64 (1,024 positions of 16), so only long contexts split there.
const LONG_SPLIT_BLOCKS: usize = 64;
/// Splits a row's keys take at most past [`SPLIT_ATTENTION_ROWS`] rows.
const LONG_MAX_SPLITS: usize = 8;
/// Blocks of decode attention 132 multiprocessors hold at once: three of
/// the tensor-core kernel's at heads of 128 (by registers).
const ATTENTION_WAVE: usize = 3 * 132;

/// Splits of each row's long context past [`SPLIT_ATTENTION_ROWS`] rows:
/// a launch whose blocks all take about as long runs in waves, so 64 rows
/// of Llama-3-8B (512 blocks of heads, 396 a wave) take two blocks' time
/// where 116 of them fill the second wave; split three ways, 1,536 blocks
/// of a third the length in four waves take 1.33. The splits (of at least
/// [`LONG_SPLIT_BLOCKS`] cache blocks, at most [`LONG_MAX_SPLITS`]) whose
/// waves take the least time, where that is at least a tenth less than
/// unsplit; else one.
fn long_context_splits(tokens: usize, blocks_per_row: usize, blocks_per_seq: usize) -> usize {
    let most = most_long_context_splits(tokens, blocks_per_seq);
    let blocks = tokens * blocks_per_row.max(1);
    // The launch's time in unsplit blocks' lengths, ⌈blocks · s / wave⌉ / s,
    // as the fraction (waves, s).
    let waves = |s: usize| (blocks * s).div_ceil(ATTENTION_WAVE);
    let best = (2..=most).fold(1, |best, s| {
        if waves(s) * best < waves(best) * s {
            s
        } else {
            best
        }
    });
    // At least a tenth less: waves(best) / best ≤ 0.9 · waves(1).
    if 10 * waves(best) <= 9 * waves(1) * best {
        best
    } else {
        1
    }
}

/// The most splits [`long_context_splits`] may take: splits of at least
/// [`LONG_SPLIT_BLOCKS`] cache blocks, at most [`LONG_MAX_SPLITS`], none past
/// [`LONG_SPLIT_ROWS`] rows.
fn most_long_context_splits(tokens: usize, blocks_per_seq: usize) -> usize {
    match tokens {
        ..=LONG_SPLIT_ROWS => (blocks_per_seq / LONG_SPLIT_BLOCKS).clamp(1, LONG_MAX_SPLITS),
        _ => 1,
    }
}

/// The most splits a step of `tokens` rows over block tables
/// `blocks_per_seq` wide takes, whatever its blocks of heads (scratch and
/// counters are sized for it).
fn most_attention_splits(tokens: usize, blocks_per_seq: usize) -> usize {
    if tokens > SPLIT_ATTENTION_ROWS {
        return most_long_context_splits(tokens, blocks_per_seq);
    }
    attention_splits(tokens, 1, blocks_per_seq)
}

/// Bytes of the counters of finished splits an attention step whose q is
/// `q_shape` ([T, H, D]) and block tables `tables_shape` ([B, M]) needs: one
/// per row and block of query heads (at most H), where it splits.
pub fn split_counter_bytes(q_shape: &[usize], tables_shape: &[usize]) -> usize {
    let (&[tokens, heads, _], Some(&width)) = (q_shape, tables_shape.get(1)) else {
        return 0;
    };
    match most_attention_splits(tokens, width) {
        1 => 0,
        _ => tokens * heads * 4,
    }
}

/// Scratch bytes of an attention step whose q is `q_shape` ([T, H, D]) and
/// block tables `tables_shape` ([B, M]): the splits' partial results.
pub fn attention_scratch_bytes(q_shape: &[usize], tables_shape: &[usize]) -> usize {
    let (&[tokens, heads, head_dim], Some(&width)) = (q_shape, tables_shape.get(1)) else {
        return 0;
    };
    match most_attention_splits(tokens, width) {
        1 => 0,
        splits => tokens * heads * splits * (head_dim + 2) * 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotary_rows_split_into_stretches_until_the_launch_fills_the_gpu() {
        // Llama-3-8B's q and k (40 heads of 64 pairs, ten stretches of
        // 256) at 64 rows: eight stretches a row (512 blocks, one wave of
        // four an SM); at 128 rows four; past 264 rows one, as in a
        // prefill; a tiny model's 96 rotations, one stretch of 96 threads.
        let shape = |c: LaunchConfig| (c.grid, c.block.0);
        assert_eq!(shape(rope_config(64, 2560)), ((64, 8, 1), 256));
        assert_eq!(shape(rope_config(128, 2560)), ((128, 4, 1), 256));
        assert_eq!(shape(rope_config(265, 2560)), ((265, 1, 1), 256));
        assert_eq!(shape(rope_config(2048, 2560)), ((2048, 1, 1), 256));
        assert_eq!(shape(rope_config(1, 96)), ((1, 1, 1), 96));
    }

    /// The value of `#define NAME <number>` in a kernel source.
    fn define(source: &str, name: &str) -> usize {
        source
            .lines()
            .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
            .and_then(|n| n.trim().parse::<usize>().ok())
            .unwrap_or_else(|| panic!("#define {name} in the kernel source"))
    }

    #[test]
    fn no_step_splits_past_what_the_merge_takes() {
        let kernel_most = define(
            kiln_kernels::cuda::sources::PAGED_ATTENTION_HEADER,
            "KILN_MAX_SPLITS",
        );
        assert!(MAX_SPLITS <= kernel_most);
        assert!(LONG_MAX_SPLITS <= kernel_most);
        for tokens in [1, 2, 4, 16, 17, 64, 256] {
            for width in [1, 16, 128, 1024, 8192] {
                assert!(most_attention_splits(tokens, width) <= kernel_most);
            }
        }
    }

    #[test]
    fn few_rows_split_their_keys_until_the_launch_fills_the_gpu() {
        // Llama-3-8B at batch 1 (eight blocks of four query heads a row):
        // ~200 positions (tables 16 blocks wide) split into every block,
        // 2k positions into the most splits; a single block stays whole.
        assert_eq!(attention_splits(1, 8, 16), 16);
        assert_eq!(attention_splits(1, 8, 128), MAX_SPLITS);
        assert_eq!(attention_splits(1, 8, 1), 1);
        // Four rows: 9 splits of ~200 positions make 288 blocks.
        assert_eq!(attention_splits(4, 8, 16), 9);
        // Sixteen rows fill it with splits of four cache blocks; more rows
        // split only long contexts, to even out the launch's waves.
        assert_eq!(attention_splits(16, 8, 16), 4);
        assert_eq!(attention_splits(16, 8, 128), MAX_SPLITS);
        assert_eq!(attention_splits(17, 8, 32), 1);
        assert_eq!(attention_splits(64, 8, 32), 1);
        // 64 rows of Llama-3-8B (512 blocks, 396 a wave) at 2k positions:
        // two splits, 1.5 blocks' time for 2; at 4k, three, 1.33.
        assert_eq!(attention_splits(64, 8, 128), 2);
        assert_eq!(attention_splits(64, 8, 256), 3);
        // 32 rows (256 blocks, a wave not full): three splits at 4k in two
        // waves; two at 2k would take as long as none.
        assert_eq!(attention_splits(32, 8, 128), 1);
        assert_eq!(attention_splits(32, 8, 256), 3);
        // 256 rows: 2,048 blocks in six waves; two splits at 2k take 5.5
        // (under a tenth less), four at 4k 5.25. Past 256 rows, none.
        assert_eq!(attention_splits(256, 8, 128), 1);
        assert_eq!(attention_splits(256, 8, 256), 4);
        assert_eq!(attention_splits(257, 8, 256), 1);
        // Scratch and counters are sized for the most splits any blocks of
        // heads take.
        assert!(most_attention_splits(4, 16) >= attention_splits(4, 1, 16));
        for (tokens, width) in [(17, 128), (64, 256), (200, 512), (256, 1024)] {
            let most = most_attention_splits(tokens, width);
            for blocks_per_row in [1, 2, 8, 32] {
                assert!(most >= attention_splits(tokens, blocks_per_row, width));
            }
        }
        assert_eq!(most_attention_splits(300, 1024), 1);
        assert_eq!(
            attention_scratch_bytes(&[1, 32, 128], &[1, 16]),
            32 * 16 * 130 * 4
        );
    }

    #[test]
    fn tensor_core_splits_keep_a_round_of_keys_a_block() {
        let source = kiln_kernels::cuda::sources::DECODE_ATTENTION.text;
        let round = define(source, "KILN_DECODE_WARPS") * define(source, "KILN_DECODE_KEYS");
        assert_eq!(DECODE_ROUND_KEYS, round);
        // Batch 1 over ~200 positions (16 blocks of 16): four splits of
        // 64 keys on tensor cores, not 16 of one block as elsewhere (and
        // with KILN_SHORT_ATTENTION_SPLITS); 2k positions keep the most.
        assert_eq!(launch_splits((1, 8), (16, 16), true), 4);
        assert_eq!(launch_splits((1, 8), (16, 16), false), 16);
        assert_eq!(launch_splits((1, 8), (128, 16), true), MAX_SPLITS);
        // Blocks of 4 positions; fewer keys than a round: unsplit.
        assert_eq!(launch_splits((1, 8), (64, 4), true), 4);
        assert_eq!(launch_splits((1, 8), (3, 16), true), 1);
        // Past 16 rows the long-context splits hold rounds already.
        assert_eq!(
            launch_splits((64, 8), (256, 16), true),
            attention_splits(64, 8, 256)
        );
    }

    #[test]
    fn decode_rows_take_tensor_cores_over_half_caches_of_heads_of_64_to_256() {
        let llama = decode_kernel(KvElement::Bf16, 32, 8, 128);
        assert_eq!(llama, Some("kiln_decode_attention_bf16_d128"));
        let small = decode_kernel(KvElement::Bf16, 9, 3, 64);
        assert_eq!(small, Some("kiln_decode_attention_bf16_d64"));
        assert_eq!(
            decode_kernel(KvElement::Bf16, 12, 12, 64),
            Some("kiln_decode_attention_bf16_d64")
        );
        let gemma = decode_kernel(KvElement::Bf16, 8, 4, 256);
        assert_eq!(gemma, Some("kiln_decode_attention_bf16_d256"));
        // Not: 16 query heads a key/value head, heads of 96, an f32 cache.
        assert_eq!(decode_kernel(KvElement::Bf16, 32, 2, 128), None);
        assert_eq!(decode_kernel(KvElement::Bf16, 8, 8, 96), None);
        assert_eq!(decode_kernel(KvElement::F32, 32, 8, 128), None);
        let fp8 = decode_kernel(KvElement::Fp8, 32, 8, 128);
        assert_eq!(fp8, Some("kiln_decode_attention_fp8_d128"));
    }

    #[test]
    fn grouped_kernels_take_heads_of_multiples_of_8_up_to_256() {
        // Llama-3-8B: 32 query heads over 8 of 128 values, four to a block.
        let llama = grouped_kernel(KvElement::Bf16, 32, 8, 128);
        assert_eq!(llama, Some(("kiln_grouped_attention_g4_bf16", 4)));
        let fp8 = grouped_kernel(KvElement::Fp8, 32, 8, 128);
        assert_eq!(fp8, Some(("kiln_grouped_attention_g4_fp8", 4)));
        // Qwen2.5-7B's 7 query heads a key/value head: blocks of 4 and 3.
        let qwen = grouped_kernel(KvElement::F32, 28, 4, 128);
        assert_eq!(qwen.map(|k| k.1), Some(4));
        let pairs = grouped_kernel(KvElement::Bf16, 16, 8, 64);
        assert_eq!(pairs.map(|k| k.1), Some(2));
        let single = grouped_kernel(KvElement::Fp8, 12, 12, 64);
        assert_eq!(single, Some(("kiln_grouped_attention_g1_fp8", 1)));
        // DeepSeek's latent head and heads not of whole 16-byte loads.
        assert_eq!(grouped_kernel(KvElement::Bf16, 16, 1, 576), None);
        assert_eq!(grouped_kernel(KvElement::F32, 4, 2, 36), None);
    }
}
