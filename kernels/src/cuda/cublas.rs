//! Matrix products on the real GPU: the cuBLAS handle and its workspace,
//! `GemmEx`, and products of decode's and prefill chunks' row counts on
//! cuBLASLt in the
//! algorithm that timing on the card found fastest (issue 14's "cuBLASLt
//! algorithms chosen at start-up by timing").
//!
//! `GemmEx` picks one algorithm by cuBLAS's heuristics, and at 16 to 64 rows
//! of x its picks are uneven: on the H200, Llama-3-8B's o projection at 64
//! rows streamed at 2.4 TB/s where gate and up reached 3.5
//! (`bench/results/gpu-2026-11-30b`).
//!
//! The first time a product of a new shape runs outside a graph capture (a
//! step's binding runs eagerly once before it is captured), `GemmEx` and up
//! to [`CANDIDATES`] of cuBLASLt's heuristic algorithms are each timed on
//! that very product, the L2 cache overwritten before every run (a decode
//! step streams its weights from memory, not from L2), and the fastest is
//! kept for the shape, each candidate in turn replacing the best so far
//! only where it beats it by 2 % (so timings within noise keep `GemmEx`,
//! or the heuristic's earlier pick, from one run to the next). Every
//! algorithm is deterministic, so a shape gives the same bits from then on
//! within a process; `KILN_GEMM_ALGORITHM=heuristic` gives bits that no
//! timing decides. Only the row counts of decode's buckets (up to 256 rows,
//! a power of two or a multiple of 8) and of whole prefill chunks
//! (multiples of 1,024 rows) are timed: prompts of other lengths would each
//! pay a timing.

use std::collections::hash_map::{Entry, HashMap};
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::sync::Mutex;

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{result as cublas, sys as cublas_sys};
use cudarc::cublaslt::{result as lt, sys as lt_sys};
use cudarc::driver::{result, sys, CudaContext, CudaStream};

use super::device::{DeviceError, DevicePtr, DeviceResult, Gemm, GemmType, WeightLayout};

/// Rows of x of decode's largest bucket by default: up to it, the buckets'
/// row counts are timed.
const MAX_DECODE_ROWS: usize = 256;
/// Rows of x of prefill chunks timed at most: multiples of 1,024 up to it
/// (`--max-num-batched-tokens`, 2,048 by default, fills whole chunks).
const MAX_CHUNK_ROWS: usize = 16384;
/// cuBLASLt's algorithms timed at most, in its heuristic's order.
const CANDIDATES: usize = 8;
/// Timed runs of each candidate (after one untimed run); their median counts.
const RUNS: usize = 5;
/// A candidate replaces the best so far (`GemmEx` first) only below this
/// share of its time.
const MARGIN: f64 = 0.98;

/// Whether products of `m` rows of x are timed: decode's buckets
/// (`buckets.rs` in the host: powers of two, then multiples of 8) and
/// whole prefill chunks (a 2048-token prompt's products took 70 % of its
/// kernel time on the H200, at ~640 of cuBLAS's 873 TFLOP/s for the MLP's).
fn timed_rows(m: usize) -> bool {
    let decode = m <= MAX_DECODE_ROWS && (m.is_power_of_two() || m.is_multiple_of(8));
    let chunk = m <= MAX_CHUNK_ROWS && m.is_multiple_of(1024);
    decode || chunk
}

/// The largest power of two up to 256 dividing `ptr`: an algorithm may need
/// its operands aligned to more than their elements.
fn alignment(ptr: DevicePtr) -> u32 {
    1 << ptr.trailing_zeros().min(8)
}

/// A product's shape as cuBLASLt's algorithms see it: sizes, types, the
/// weight's layout and the alignment of W, x and y.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Shape {
    m: usize,
    n: usize,
    k: usize,
    ty: GemmType,
    y_type: GemmType,
    layout: WeightLayout,
    alignments: [u32; 3],
}

impl Shape {
    fn of(g: &Gemm) -> Self {
        Self {
            m: g.m,
            n: g.n,
            k: g.k,
            ty: g.ty,
            y_type: g.y_type,
            layout: g.layout,
            alignments: [alignment(g.w), alignment(g.x), alignment(g.y)],
        }
    }
}

fn data_type(ty: GemmType) -> lt_sys::cudaDataType {
    match ty {
        GemmType::F32 => lt_sys::cudaDataType::CUDA_R_32F,
        GemmType::BF16 => lt_sys::cudaDataType::CUDA_R_16BF,
        GemmType::F16 => lt_sys::cudaDataType::CUDA_R_16F,
    }
}

fn lt_error(what: &str) -> impl Fn(lt::CublasError) -> DeviceError + '_ {
    move |e| DeviceError::new(format!("{what}: {e:?}"))
}

fn driver_error(what: &str) -> impl Fn(result::DriverError) -> DeviceError + '_ {
    move |e| DeviceError::new(format!("{what}: {e}"))
}

/// cuBLASLt's description of one shape's product, column-major as in the
/// driver's `GemmEx` call: D = yᵀ [n, m] = op(A) · B, A = W (`[k, n]`
/// transposed for [`WeightLayout::OutIn`], `[n, k]` for `InOut`), B = xᵀ
/// `[k, m]`; C is D (β = 0).
struct Descriptors {
    matmul: lt_sys::cublasLtMatmulDesc_t,
    a: lt_sys::cublasLtMatrixLayout_t,
    b: lt_sys::cublasLtMatrixLayout_t,
    d: lt_sys::cublasLtMatrixLayout_t,
}

impl Descriptors {
    fn new(shape: &Shape) -> DeviceResult<Self> {
        let (n, m, k) = (shape.n as u64, shape.m as u64, shape.k as u64);
        let matmul = lt::create_matmul_desc(
            lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            lt_sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(lt_error("cublasLtMatmulDescCreate"))?;
        // Built up so that `Drop` releases whatever was created before an error.
        let mut made = Self {
            matmul,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
        };
        let (transa, a_rows, a_cols) = match shape.layout {
            WeightLayout::OutIn => (cublasOperation_t::CUBLAS_OP_T, k, n),
            WeightLayout::InOut => (cublasOperation_t::CUBLAS_OP_N, n, k),
        };
        let transa = transa as i32;
        // SAFETY: the descriptor is live; the value is the attribute's type.
        unsafe {
            lt::set_matmul_desc_attribute(
                matmul,
                lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                (&transa as *const i32).cast(),
                std::mem::size_of::<i32>(),
            )
        }
        .map_err(lt_error("cublasLtMatmulDescSetAttribute (transa)"))?;
        let layout = |ty, rows, cols| {
            lt::create_matrix_layout(data_type(ty), rows, cols, rows as i64)
                .map_err(lt_error("cublasLtMatrixLayoutCreate"))
        };
        made.a = layout(shape.ty, a_rows, a_cols)?;
        made.b = layout(shape.ty, k, m)?;
        made.d = layout(shape.y_type, n, m)?;
        Ok(made)
    }
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created in `new` (or is null) and is
        // destroyed once.
        unsafe {
            for layout in [self.a, self.b, self.d] {
                if !layout.is_null() {
                    let _ = lt::destroy_matrix_layout(layout);
                }
            }
            let _ = lt::destroy_matmul_desc(self.matmul);
        }
    }
}

/// The algorithm kept for a shape, with its descriptors.
struct Plan {
    descriptors: Descriptors,
    algo: lt_sys::cublasLtMatmulAlgo_t,
}

/// cuBLAS's workspace (NVIDIA recommends 32 MiB on Hopper).
pub(super) const CUBLAS_WORKSPACE: usize = 32 << 20;

/// cuBLASLt's timed algorithms on `context`'s card, or `None` (with a
/// warning: every product then runs by `GemmEx`).
pub(super) fn gemm_algorithms_on(context: &CudaContext) -> Option<GemmAlgorithms> {
    let l2_bytes = context
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
        .map_err(|e| format!("the L2 cache's size: {e}"))
        .and_then(|bytes| GemmAlgorithms::new(bytes.max(0) as usize));
    l2_bytes
        .map_err(|e| {
            log::warn!("cuBLASLt's algorithms are not timed ({e}): cublasGemmEx for every product")
        })
        .ok()
}

/// A cuBLAS handle on `stream` with a workspace of our own (setting the
/// stream resets it): cuBLAS then allocates nothing while a step is
/// captured as a CUDA graph, and the memory counts before the KV cache is
/// sized. Nothing is left behind on failure.
pub(super) fn cublas_on(
    stream: &CudaStream,
) -> DeviceResult<(cublas_sys::cublasHandle_t, DevicePtr)> {
    let handle =
        cublas::create_handle().map_err(|e| DeviceError::new(format!("cublasCreate: {e:?}")))?;
    let release = |workspace: Option<DevicePtr>, error: DeviceError| {
        // SAFETY: the handle and the workspace were created above, and are
        // released once.
        unsafe {
            let _ = cublas::destroy_handle(handle);
            if let Some(workspace) = workspace {
                let _ = result::free_sync(workspace);
            }
        }
        error
    };
    // SAFETY: the handle and the stream are live.
    unsafe { cublas::set_stream(handle, stream.cu_stream() as _) }
        .map_err(|e| release(None, DeviceError::new(format!("cublasSetStream: {e:?}"))))?;
    // SAFETY: a plain allocation, kept for the device's life.
    let workspace = unsafe { result::malloc_sync(CUBLAS_WORKSPACE) }
        .map_err(|e| release(None, driver_error("allocating the cuBLAS workspace")(e)))?;
    // SAFETY: the handle is live; the workspace outlives it.
    unsafe {
        cublas_sys::cublasSetWorkspace_v2(handle, workspace as *mut c_void, CUBLAS_WORKSPACE)
    }
    .result()
    .map_err(|e| {
        release(
            Some(workspace),
            DeviceError::new(format!("cublasSetWorkspace: {e:?}")),
        )
    })?;
    Ok((handle, workspace))
}

/// `g` by cuBLAS's `GemmEx` on `handle`, in the algorithm its heuristics
/// pick.
pub(super) fn gemm_ex(handle: cublas_sys::cublasHandle_t, g: &Gemm) -> DeviceResult<()> {
    use cublas_sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
    let data_type = |ty: GemmType| match ty {
        GemmType::F32 => cudaDataType::CUDA_R_32F,
        GemmType::BF16 => cudaDataType::CUDA_R_16BF,
        GemmType::F16 => cudaDataType::CUDA_R_16F,
    };
    let (ty, y_type) = (data_type(g.ty), data_type(g.y_type));
    let (alpha, beta) = (1.0f32, 0.0f32);
    let (m, n, k) = (g.m as i32, g.n as i32, g.k as i32);
    // Column-major: yᵀ [n, m] = op(W) · xᵀ [k, m]; W [n, k] row-major is
    // column-major [k, n] (transa = T), W [k, n] is column-major [n, k].
    let (transa, lda) = match g.layout {
        WeightLayout::OutIn => (cublasOperation_t::CUBLAS_OP_T, k),
        WeightLayout::InOut => (cublasOperation_t::CUBLAS_OP_N, n),
    };
    // SAFETY: the pointers address live allocations of the sizes the
    // product reads and writes.
    unsafe {
        cublas::gemm_ex(
            handle,
            transa,
            cublasOperation_t::CUBLAS_OP_N,
            n,
            m,
            k,
            (&alpha as *const f32).cast(),
            g.w as *const c_void,
            ty,
            lda,
            g.x as *const c_void,
            ty,
            k,
            (&beta as *const f32).cast(),
            g.y as *mut c_void,
            y_type,
            n,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| DeviceError::new(format!("cublasGemmEx {m}x{n}x{k}: {e:?}")))
}

/// What the driver needs to run a product: its stream, cuBLAS's workspace
/// and its `GemmEx` route.
pub(super) struct Route<'a> {
    pub stream: sys::CUstream,
    pub workspace: (DevicePtr, usize),
    pub gemm_ex: &'a dyn Fn() -> DeviceResult<()>,
}

/// The chosen algorithm of every timed shape, and what timing needs.
pub(super) struct GemmAlgorithms {
    handle: lt_sys::cublasLtHandle_t,
    /// Written before every timed run, twice the size of the L2 cache.
    flush: DevicePtr,
    flush_bytes: usize,
    /// Recorded around a timed run.
    events: [sys::CUevent; 2],
    /// By shape: the algorithm kept, or `None` for `GemmEx`.
    chosen: Mutex<HashMap<Shape, Option<Plan>>>,
}

// SAFETY: the handles are only used with the device's context bound and
// behind `chosen`'s lock (which every use of the events and flush holds).
unsafe impl Send for GemmAlgorithms {}
// SAFETY: as above.
unsafe impl Sync for GemmAlgorithms {}

impl GemmAlgorithms {
    /// cuBLASLt and a flush buffer for a card with `l2_bytes` of L2 cache;
    /// `None`, with the reason, where cuBLASLt is missing or refuses.
    pub(super) fn new(l2_bytes: usize) -> Result<Self, String> {
        // SAFETY: only tries to open the library by its known names.
        if !unsafe { lt_sys::is_culib_present() } {
            return Err("libcublasLt.so.13 could not be loaded".into());
        }
        let handle = lt::create_handle().map_err(|e| format!("cublasLtCreate: {e:?}"))?;
        let flush_bytes = (2 * l2_bytes).max(1 << 20);
        // SAFETY: plain allocations and events, released in `Drop` (or here
        // on failure).
        unsafe {
            let release = |flush: Option<DevicePtr>| {
                let _ = lt::destroy_handle(handle);
                if let Some(flush) = flush {
                    let _ = result::free_sync(flush);
                }
            };
            let flush = result::malloc_sync(flush_bytes).map_err(|e| {
                release(None);
                format!("allocating {flush_bytes} bytes to flush the L2 cache: {e}")
            })?;
            let event = || result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT);
            let events = match (event(), event()) {
                (Ok(a), Ok(b)) => [a, b],
                (a, b) => {
                    for e in [a, b].into_iter().flatten() {
                        let _ = result::event::destroy(e);
                    }
                    release(Some(flush));
                    return Err("cuEventCreate failed".into());
                }
            };
            Ok(Self {
                handle,
                flush,
                flush_bytes,
                events,
                chosen: Mutex::default(),
            })
        }
    }

    /// Runs `g`: in the algorithm kept for its shape, timing the candidates
    /// first where the shape is new, decode's and not `capturing`; else by
    /// `GemmEx`. A shape whose timing fails keeps `GemmEx`, with a warning.
    pub(super) fn run(&self, g: &Gemm, capturing: bool, route: &Route) -> DeviceResult<()> {
        if g.ty == GemmType::F32 || !timed_rows(g.m) {
            return (route.gemm_ex)();
        }
        let shape = Shape::of(g);
        let mut chosen = self.chosen.lock().unwrap_or_else(|e| e.into_inner());
        let plan = match chosen.entry(shape) {
            Entry::Occupied(kept) => kept.into_mut(),
            Entry::Vacant(_) if capturing => return (route.gemm_ex)(),
            Entry::Vacant(new) => {
                let plan = self.choose(g, &shape, route).unwrap_or_else(|e| {
                    log::warn!(
                        "timing cuBLASLt's algorithms for {}: {e}; cublasGemmEx kept",
                        describe(&shape)
                    );
                    None
                });
                new.insert(plan)
            }
        };
        match plan {
            Some(plan) => self.matmul(g, &plan.descriptors, &plan.algo, route),
            None => (route.gemm_ex)(),
        }
    }

    /// Times `GemmEx` and cuBLASLt's candidates for `shape` on `g`; the
    /// algorithm to keep, if one beats `GemmEx`. Each candidate, in the
    /// heuristic's order, must beat the best so far by [`MARGIN`]: timings
    /// within noise of each other keep the same pick from run to run.
    fn choose(&self, g: &Gemm, shape: &Shape, route: &Route) -> DeviceResult<Option<Plan>> {
        let descriptors = Descriptors::new(shape)?;
        let candidates = self.candidates(shape, &descriptors, route.workspace.1)?;
        let default = self.time(route.stream, &mut || (route.gemm_ex)())?;
        let mut report = vec![format!("cublasGemmEx {:.1} µs", default * 1e6)];
        let (mut best, mut kept) = (default, None);
        for algo in candidates {
            // An algorithm that fails to run is left out.
            match self.time(route.stream, &mut || {
                self.matmul(g, &descriptors, &algo, route)
            }) {
                Ok(seconds) => {
                    report.push(format!("{} {:.1} µs", describe_algo(&algo), seconds * 1e6));
                    if seconds < MARGIN * best {
                        (best, kept) = (seconds, Some(algo));
                    }
                }
                Err(e) => report.push(format!("{}: {e}", describe_algo(&algo))),
            }
        }
        log::debug!(
            "GEMM {}: {} ({})",
            describe(shape),
            kept.map_or("cublasGemmEx".to_owned(), |algo| describe_algo(&algo)),
            report.join(", ")
        );
        Ok(kept.map(|algo| Plan { descriptors, algo }))
    }

    /// cuBLASLt's heuristic algorithms for `shape` within `workspace` bytes,
    /// best first.
    fn candidates(
        &self,
        shape: &Shape,
        descriptors: &Descriptors,
        workspace: usize,
    ) -> DeviceResult<Vec<lt_sys::cublasLtMatmulAlgo_t>> {
        use lt_sys::cublasLtMatmulPreferenceAttributes_t as Pref;
        let preference =
            lt::create_matmul_pref().map_err(lt_error("cublasLtMatmulPreferenceCreate"))?;
        let workspace = workspace as u64;
        let [w, x, y] = shape.alignments;
        let settings: [(Pref, *const c_void, usize); 5] = [
            (
                Pref::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&workspace as *const u64).cast(),
                8,
            ),
            (
                Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                (&w as *const u32).cast(),
                4,
            ),
            (
                Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                (&x as *const u32).cast(),
                4,
            ),
            (
                Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                (&y as *const u32).cast(),
                4,
            ),
            (
                Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                (&y as *const u32).cast(),
                4,
            ),
        ];
        let mut results =
            [MaybeUninit::<lt_sys::cublasLtMatmulHeuristicResult_t>::zeroed(); CANDIDATES];
        let mut count = 0;
        // SAFETY: the preference and descriptors are live; each value is its
        // attribute's type; `results` holds CANDIDATES entries.
        let found = unsafe {
            settings
                .iter()
                .try_for_each(|&(attribute, value, bytes)| {
                    lt::set_matmul_pref_attribute(preference, attribute, value, bytes)
                })
                .and_then(|()| {
                    lt_sys::cublasLtMatmulAlgoGetHeuristic(
                        self.handle,
                        descriptors.matmul,
                        descriptors.a,
                        descriptors.b,
                        descriptors.d,
                        descriptors.d,
                        preference,
                        CANDIDATES as i32,
                        results.as_mut_ptr().cast(),
                        &mut count,
                    )
                    .result()
                })
        };
        // SAFETY: created above, destroyed once.
        let _ = unsafe { lt::destroy_matmul_pref(preference) };
        found.map_err(lt_error("cublasLtMatmulAlgoGetHeuristic"))?;
        let count = (count.max(0) as usize).min(CANDIDATES);
        Ok(results[..count]
            .iter()
            // SAFETY: the heuristic filled the first `count` entries.
            .map(|r| unsafe { r.assume_init() })
            .filter(|r| r.state == lt_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .filter(|r| r.workspaceSize as u64 <= workspace)
            .map(|r| r.algo)
            .collect())
    }

    /// `g` by cuBLASLt in algorithm `algo`, described by `d`.
    fn matmul(
        &self,
        g: &Gemm,
        d: &Descriptors,
        algo: &lt_sys::cublasLtMatmulAlgo_t,
        route: &Route,
    ) -> DeviceResult<()> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the descriptors describe `g`'s operands, live allocations
        // of the sizes the product reads and writes; the workspace is the
        // device's, used in stream order.
        unsafe {
            lt::matmul(
                self.handle,
                d.matmul,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                g.w as *const c_void,
                d.a,
                g.x as *const c_void,
                d.b,
                g.y as *const c_void,
                d.d,
                g.y as *mut c_void,
                d.d,
                algo,
                route.workspace.0 as *mut c_void,
                route.workspace.1,
                route.stream as lt_sys::cudaStream_t,
            )
        }
        .map_err(lt_error("cublasLtMatmul"))
    }

    /// The median seconds of [`RUNS`] runs of `run` on `stream`, each after
    /// the L2 cache is overwritten, following one untimed run.
    fn time(
        &self,
        stream: sys::CUstream,
        run: &mut dyn FnMut() -> DeviceResult<()>,
    ) -> DeviceResult<f64> {
        run()?;
        let [start, end] = self.events;
        let mut times = Vec::with_capacity(RUNS);
        for i in 0..RUNS {
            // SAFETY: the flush buffer and events are live; the stream is the
            // device's, bound by the caller.
            let elapsed_ms = unsafe {
                result::memset_d8_async(self.flush, i as u8, self.flush_bytes, stream)
                    .map_err(driver_error("cuMemsetD8Async"))?;
                result::event::record(start, stream).map_err(driver_error("cuEventRecord"))?;
                run()?;
                result::event::record(end, stream).map_err(driver_error("cuEventRecord"))?;
                result::event::synchronize(end).map_err(driver_error("cuEventSynchronize"))?;
                result::event::elapsed(start, end).map_err(driver_error("cuEventElapsedTime"))?
            };
            times.push(f64::from(elapsed_ms) * 1e-3);
        }
        times.sort_by(f64::total_cmp);
        Ok(times[RUNS / 2])
    }
}

impl Drop for GemmAlgorithms {
    fn drop(&mut self) {
        self.chosen
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        // SAFETY: created in `new`, released once, the device's context
        // bound by its `Drop`.
        unsafe {
            for event in self.events {
                let _ = result::event::destroy(event);
            }
            let _ = result::free_sync(self.flush);
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

/// `m×n×k bf16→f32` and the weight's layout, for logs.
fn describe(shape: &Shape) -> String {
    format!(
        "{}×{}×{} {:?}→{:?} {:?}",
        shape.m, shape.n, shape.k, shape.ty, shape.y_type, shape.layout
    )
}

/// An algorithm's id, tile and split-K, for logs.
fn describe_algo(algo: &lt_sys::cublasLtMatmulAlgo_t) -> String {
    use lt_sys::cublasLtMatmulAlgoConfigAttributes_t as Config;
    let get = |attribute| {
        let mut value = 0i32;
        let mut written = 0usize;
        // SAFETY: reads one 4-byte attribute of a live algorithm into `value`.
        let status = unsafe {
            lt_sys::cublasLtMatmulAlgoConfigGetAttribute(
                algo,
                attribute,
                (&mut value as *mut i32).cast(),
                std::mem::size_of::<i32>(),
                &mut written,
            )
        };
        match status {
            lt_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS => value,
            _ => -1,
        }
    };
    format!(
        "algorithm {} (tile {}, split-K {})",
        get(Config::CUBLASLT_ALGO_CONFIG_ID),
        get(Config::CUBLASLT_ALGO_CONFIG_TILE_ID),
        get(Config::CUBLASLT_ALGO_CONFIG_SPLITK_NUM)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_buckets_and_whole_prefill_chunks_are_timed_and_other_row_counts_are_not() {
        for m in [
            1, 2, 4, 8, 16, 24, 64, 128, 200, 256, 1024, 2048, 8192, 16384,
        ] {
            assert!(timed_rows(m), "{m}");
        }
        for m in [3, 12, 70, 257, 264, 512, 1500, 2047, 2056, 17408] {
            assert!(!timed_rows(m), "{m}");
        }
    }

    #[test]
    fn alignment_is_the_pointers_power_of_two_up_to_256() {
        assert_eq!(alignment(0x7f00_0000_0000), 256);
        assert_eq!(alignment(0x7f00_0000_0010), 16);
        assert_eq!(alignment(0x7f00_0000_0002), 2);
        assert_eq!(alignment(0x7f00_0000_0300), 256);
    }
}
