//! The device interface every CUDA backend runs on: the real GPU through the
//! CUDA driver ([`super::driver`]) or the CPU through the kernel emulator
//! ([`super::emulator`]). Memory is addressed by raw device pointers; kernels
//! are CUDA C sources compiled by the device (NVRTC, or the host C++ compiler
//! for the emulator) and launched by name with cuLaunchKernel-style arguments.

use std::fmt;

/// A device address (a host address on the emulator).
pub type DevicePtr = u64;

/// A kernel of a loaded module, resolved once and launched many times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FunctionId(pub usize);

/// A device-to-host copy queued by [`Device::download_async`], to be
/// collected once with [`Device::wait_readback`].
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Readback(pub usize);

/// A captured launch sequence (a CUDA graph).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphId(pub usize);

/// Dynamic shared memory a launch may take: what every card of compute
/// capability 8.0 and newer allows a block (sm_86 and sm_89: 99 KiB; sm_80:
/// 163; sm_90: 227). Past 48 KiB the driver opts the kernel in first.
pub const MAX_DYNAMIC_SHARED: u32 = 99 * 1024;

/// Grid and block sizes and dynamic shared memory of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub shared_bytes: u32,
    /// Launched as a programmatic dependent (sm_90+): the kernel may start
    /// while the previous one in the stream still runs, so every thread
    /// must call `kiln_wait_inputs()` (`kiln_cuda.cuh`) before it reads
    /// anything but weights or writes anything (the emulator checks the
    /// call). Devices without programmatic launch launch it plainly.
    pub programmatic: bool,
}

impl LaunchConfig {
    /// A grid of `grid` blocks of `block` threads, no dynamic shared
    /// memory, launched plainly.
    pub fn new(grid: (u32, u32, u32), block: (u32, u32, u32)) -> Self {
        Self {
            grid,
            block,
            shared_bytes: 0,
            programmatic: false,
        }
    }

    /// `blocks` blocks of `threads` threads in x.
    pub fn linear(blocks: u32, threads: u32) -> Self {
        Self::new((blocks.max(1), 1, 1), (threads, 1, 1))
    }

    /// Enough blocks of 256 threads for `n` elements (grid-stride kernels
    /// loop over the rest).
    pub fn elementwise(n: usize) -> Self {
        Self::linear(n.div_ceil(256).clamp(1, 65_535) as u32, 256)
    }

    /// Fails where cuLaunchKernel would (CUDA_ERROR_INVALID_VALUE): an empty
    /// grid or block, a grid past 2³¹ − 1 blocks in x or 65,535 in y or z,
    /// a block past 1,024 threads (1,024 in x or y, 64 in z), or more than
    /// [`MAX_DYNAMIC_SHARED`] bytes of dynamic shared memory. Both devices
    /// check, so a launch the GPU would refuse fails on the emulator too.
    pub fn check(&self) -> DeviceResult<()> {
        let (g, b) = (self.grid, self.block);
        let threads = u64::from(b.0) * u64::from(b.1) * u64::from(b.2);
        let problem = if g.0 == 0 || g.1 == 0 || g.2 == 0 {
            "an empty grid"
        } else if g.0 > i32::MAX as u32 || g.1 > 65_535 || g.2 > 65_535 {
            "a grid past 2^31 - 1 blocks in x or 65,535 in y or z"
        } else if threads == 0 {
            "an empty block"
        } else if threads > 1024 || b.0 > 1024 || b.1 > 1024 || b.2 > 64 {
            "a block past 1,024 threads (1,024 in x or y, 64 in z)"
        } else if self.shared_bytes > MAX_DYNAMIC_SHARED {
            "more than 99 KiB of dynamic shared memory"
        } else {
            return Ok(());
        };
        Err(DeviceError::new(format!(
            "launch of grid {g:?} and block {b:?} with {} bytes of dynamic shared memory: {problem}",
            self.shared_bytes
        )))
    }
}

/// One kernel argument, passed by value as cuLaunchKernel passes it.
#[derive(Clone, Debug, PartialEq)]
pub enum KernelArg {
    /// A device pointer.
    Ptr(DevicePtr),
    /// `int`.
    I32(i32),
    /// `long long`.
    I64(i64),
    /// `float`.
    F32(f32),
    /// A plain struct passed by value (its bytes, 8-byte aligned).
    Struct(Vec<u64>),
}

/// Two floats side by side in one word of a [`KernelArg::Struct`], `first`
/// at the lower address (a struct's `float a, b;`).
pub fn float_pair_word(first: f32, second: f32) -> u64 {
    u64::from(first.to_bits()) | u64::from(second.to_bits()) << 32
}

/// The RMS norm an embedding launch takes with its rows: its weight, its
/// output, eps, the weight's offset and the output's storage code.
pub type RowNormArgs = (DevicePtr, DevicePtr, f32, f32, u32);

/// A `KilnRowNorm` (kiln_cuda.cuh) of `norm`, or of none, with the rows
/// scaled by `scale` (1: as they are).
pub fn row_norm_arg(norm: Option<RowNormArgs>, scale: f32) -> KernelArg {
    let (w, y, eps, offset, out_type) = norm.unwrap_or((0, 0, 0.0, 0.0, 0));
    KernelArg::Struct(vec![
        w,
        y,
        float_pair_word(eps, offset),
        u64::from(out_type) | u64::from(scale.to_bits()) << 32,
    ])
}

impl KernelArg {
    /// The argument's bytes as `u64` words (8-byte aligned storage).
    fn words(&self) -> Vec<u64> {
        match self {
            KernelArg::Ptr(p) => vec![*p],
            KernelArg::I32(v) => vec![*v as u32 as u64],
            KernelArg::I64(v) => vec![*v as u64],
            KernelArg::F32(v) => vec![v.to_bits() as u64],
            KernelArg::Struct(words) => words.clone(),
        }
    }
}

/// Launch arguments as cuLaunchKernel (and the emulator) take them: each
/// argument's bytes in its own 8-byte aligned buffer, and a pointer to each.
pub(crate) struct PackedArgs {
    _storage: Vec<Vec<u64>>,
    pointers: Vec<*mut std::ffi::c_void>,
}

impl PackedArgs {
    /// Packs `args`.
    pub(crate) fn new(args: &[KernelArg]) -> Self {
        let mut storage: Vec<Vec<u64>> = args.iter().map(KernelArg::words).collect();
        let pointers = storage
            .iter_mut()
            .map(|w| w.as_mut_ptr().cast::<std::ffi::c_void>())
            .collect();
        // The pointers address the inner buffers, which moving `storage`
        // does not move.
        Self {
            _storage: storage,
            pointers,
        }
    }

    /// The argument pointers.
    pub(crate) fn pointers(&mut self) -> &mut [*mut std::ffi::c_void] {
        &mut self.pointers
    }
}

/// Element types of matrix products.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmType {
    /// 32-bit float.
    F32,
    /// bfloat16.
    BF16,
    /// IEEE half.
    F16,
}

impl GemmType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            GemmType::F32 => 4,
            GemmType::BF16 | GemmType::F16 => 2,
        }
    }
}

/// How a GEMM's weight matrix is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightLayout {
    /// `W [n, k]`: `y = x · Wᵀ` (PyTorch's `Linear`).
    OutIn,
    /// `W [k, n]`: `y = x · W` (GPT-2's `Conv1D`).
    InOut,
}

/// `y [m, n] (f32) = x [m, k] · W`, row-major, f32 accumulation, `W` stored
/// as [`WeightLayout`] says; `x` and `W` share one element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemm {
    /// Rows of x and y.
    pub m: usize,
    /// Rows of W, columns of y.
    pub n: usize,
    /// The shared inner dimension.
    pub k: usize,
    /// Element type of x and W.
    pub ty: GemmType,
    /// x.
    pub x: DevicePtr,
    /// W.
    pub w: DevicePtr,
    /// W's layout.
    pub layout: WeightLayout,
    /// y.
    pub y: DevicePtr,
    /// y's element type: f32, or a half type its f32 results are rounded
    /// to (for an element-wise kernel that reads it so).
    pub y_type: GemmType,
}

impl Gemm {
    /// Refuses what cuBLAS's `GemmEx` with f32 compute does not take: an f32
    /// product stores f32, a half one f32 or its own half type.
    pub fn check(&self) -> DeviceResult<()> {
        if self.y_type == GemmType::F32 || (self.ty != GemmType::F32 && self.y_type == self.ty) {
            return Ok(());
        }
        Err(DeviceError::new(format!(
            "a {:?} product cannot store {:?} (f32, or its own half type)",
            self.ty, self.y_type
        )))
    }
}

/// How often the host waits for a device that runs work as it is issued
/// (the emulator, the null device): work issued, readbacks queued with what
/// they read back (`T`), and the waits [`Device::host_waits`] and
/// [`Device::overlapped_waits`] count.
#[derive(Debug)]
pub(crate) struct HostWaits<T> {
    /// Work issued so far (launches, copies, uploads, replays, readbacks).
    issued: u64,
    /// Work was issued since the host last waited.
    pending: bool,
    /// Readbacks not yet collected, and `issued` when each was queued.
    readbacks: std::collections::HashMap<usize, (T, u64)>,
    next_readback: usize,
    pub(crate) waits: u64,
    pub(crate) overlapped: u64,
    /// Bytes copied to the host ([`Device::bytes_read`]).
    pub(crate) bytes_read: u64,
}

impl<T> Default for HostWaits<T> {
    fn default() -> Self {
        Self {
            issued: 0,
            pending: false,
            readbacks: std::collections::HashMap::new(),
            next_readback: 0,
            waits: 0,
            overlapped: 0,
            bytes_read: 0,
        }
    }
}

impl<T> HostWaits<T> {
    /// Notes that work was issued.
    pub(crate) fn queued(&mut self) {
        self.pending = true;
        self.issued += 1;
    }

    /// The host waits for the issued work.
    pub(crate) fn wait(&mut self) {
        if std::mem::take(&mut self.pending) {
            self.waits += 1;
        }
    }

    /// Queues a readback of `read`.
    pub(crate) fn queue_readback(&mut self, read: T) -> Readback {
        let id = self.next_readback;
        self.next_readback += 1;
        self.readbacks.insert(id, (read, self.issued));
        self.queued();
        Readback(id)
    }

    /// Waits for `readback`: one wait, overlapped when work was issued
    /// after it.
    pub(crate) fn wait_readback(&mut self, readback: Readback) -> DeviceResult<T> {
        let (read, issued_before) = self
            .readbacks
            .remove(&readback.0)
            .ok_or_else(|| DeviceError::new(format!("no readback {}", readback.0)))?;
        self.waits += 1;
        // The readback itself counts one: anything past it was queued later.
        if self.issued > issued_before + 1 {
            self.overlapped += 1;
        } else {
            self.pending = false;
        }
        Ok(read)
    }
}

/// Stream captures of a device that keeps its graphs itself (the emulator:
/// the recorded work; the null device: a count of kernels): the capture in
/// progress, `T` as it accumulates, and the captured graphs.
#[derive(Debug)]
pub(crate) struct Captures<T> {
    /// The capture in progress.
    pub(crate) current: Option<T>,
    /// Captured graphs (`None` once released).
    graphs: Vec<Option<T>>,
}

impl<T> Default for Captures<T> {
    fn default() -> Self {
        Self {
            current: None,
            graphs: Vec::new(),
        }
    }
}

impl<T> Captures<T> {
    /// Starts capturing into `empty`.
    pub(crate) fn begin(&mut self, empty: T) -> DeviceResult<()> {
        if self.current.is_some() {
            return Err(DeviceError::new("a capture is already in progress"));
        }
        self.current = Some(empty);
        Ok(())
    }

    /// Fails for what a stream capture must not record (a CUDA graph holds
    /// no uploads, readbacks, waits or allocations).
    pub(crate) fn refuse(&self, what: &str) -> DeviceResult<()> {
        match self.current {
            Some(_) => Err(DeviceError::new(format!("{what} cannot be captured"))),
            None => Ok(()),
        }
    }

    /// What the capture in progress recorded, the capture ended.
    pub(crate) fn take(&mut self) -> DeviceResult<T> {
        self.current
            .take()
            .ok_or_else(|| DeviceError::new("no capture in progress"))
    }

    /// Ends the capture in progress as a graph.
    pub(crate) fn end(&mut self) -> DeviceResult<GraphId> {
        let captured = self.take()?;
        self.graphs.push(Some(captured));
        Ok(GraphId(self.graphs.len() - 1))
    }

    /// A live graph.
    pub(crate) fn graph(&self, graph: GraphId) -> DeviceResult<&T> {
        self.graphs
            .get(graph.0)
            .and_then(Option::as_ref)
            .ok_or_else(|| DeviceError::new(format!("no graph {graph:?}")))
    }

    /// Frees a graph.
    pub(crate) fn release(&mut self, graph: GraphId) {
        if let Some(slot) = self.graphs.get_mut(graph.0) {
            *slot = None;
        }
    }
}

/// A device failure, with what was being done.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DeviceError(pub String);

impl DeviceError {
    /// An error with context.
    pub fn new(message: impl fmt::Display) -> Self {
        Self(message.to_string())
    }
}

/// Result of device operations.
pub type DeviceResult<T> = Result<T, DeviceError>;

/// Everything the CUDA backend asks of a device. Operations are ordered on
/// one stream; `download` and `synchronize` wait for the work before them,
/// nothing else does.
pub trait Device: Send + Sync {
    /// What this device is, e.g. `NVIDIA H100 80GB HBM3 (sm_90)`.
    fn name(&self) -> String;
    /// Whether the device runs what it is given: `false` for the
    /// [null device](super::null::NullDevice), which measures the host alone
    /// (no bandwidth or GEMM rate to measure there).
    fn computes(&self) -> bool {
        true
    }
    /// Free and total memory in bytes.
    fn memory(&self) -> DeviceResult<(usize, usize)>;
    /// `bytes` of zeroed memory.
    fn alloc(&self, bytes: usize) -> DeviceResult<DevicePtr>;
    /// Frees memory from [`Device::alloc`].
    fn free(&self, ptr: DevicePtr);
    /// Host to device, queued on the stream without waiting: the bytes are
    /// staged (in pinned memory on a GPU), so the caller may reuse them at
    /// once. Not allowed during a capture.
    fn upload(&self, dst: DevicePtr, bytes: &[u8]) -> DeviceResult<()>;
    /// Device to host (synchronous).
    fn download(&self, src: DevicePtr, out: &mut [u8]) -> DeviceResult<()>;
    /// Device to host without waiting: the ranges `parts` (address, bytes)
    /// are copied, behind the work queued before, into pinned memory, and
    /// [`Device::wait_readback`] waits for that copy alone, not for work
    /// queued after it. The host can so queue the next step before it
    /// reads this one's results. Not allowed during a capture.
    fn download_async(&self, parts: &[(DevicePtr, usize)]) -> DeviceResult<Readback>;
    /// Waits for `readback` and returns its bytes, the parts one after
    /// another. Counts as one host wait.
    fn wait_readback(&self, readback: Readback) -> DeviceResult<Vec<u8>>;
    /// Device to device.
    fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> DeviceResult<()>;
    /// Compiles `source` (CUDA C, `#include "kiln_cuda.cuh"` already inlined)
    /// and resolves `kernels` in it, in order.
    fn load(&self, name: &str, source: &str, kernels: &[&str]) -> DeviceResult<Vec<FunctionId>>;
    /// Compiles the `(name, source)` modules that [`Device::load`] will be
    /// asked for, side by side where compiling is slow (the real device's
    /// NVRTC, the emulator's C++ compiler: on several threads into their
    /// disk caches, so a cold start waits for the longest module, not for
    /// all of them one after another). Errors are left for `load` to
    /// report.
    fn precompile(&self, _modules: &[(&str, &str)]) {}
    /// Launches a kernel.
    fn launch(
        &self,
        function: FunctionId,
        config: LaunchConfig,
        args: &[KernelArg],
    ) -> DeviceResult<()>;
    /// A matrix product (cuBLAS, or a reference GEMM on the emulator).
    fn gemm(&self, gemm: &Gemm) -> DeviceResult<()>;
    /// Whether the first eager product of a new shape is timed to choose its
    /// algorithm (the driver's cuBLASLt choice), so that a step's first run
    /// costs far more than the next: a server runs its step shapes once at
    /// start-up. `false` (the default) where first use costs nothing extra.
    fn times_products(&self) -> bool {
        false
    }
    /// Starts recording launches and copies instead of running them.
    fn begin_capture(&self) -> DeviceResult<()>;
    /// Stops recording; the recorded work becomes a graph.
    fn end_capture(&self) -> DeviceResult<GraphId>;
    /// Runs a captured graph with the arguments recorded at capture.
    fn replay(&self, graph: GraphId) -> DeviceResult<()>;
    /// Frees a captured graph.
    fn release_graph(&self, graph: GraphId);
    /// Checks that `record`, the work of an eager run of the step captured as
    /// `graph`, issues exactly the captured work (a launch whose arguments
    /// changed since the capture would replay stale values). `record` only
    /// records, nothing runs. `Ok(false)` where the device cannot check (the
    /// driver); the kernel emulator checks every replay.
    fn check_replay(
        &self,
        graph: GraphId,
        record: &mut dyn FnMut() -> Result<(), String>,
    ) -> DeviceResult<bool> {
        let _ = (graph, record);
        Ok(false)
    }
    /// Opens (`true`) or closes the range a profiler attached with its
    /// range API sees (`cuProfilerStart`/`cuProfilerStop`); nothing
    /// elsewhere.
    fn profiler(&self, on: bool) -> DeviceResult<()> {
        let _ = on;
        Ok(())
    }
    /// Waits for all queued work.
    fn synchronize(&self) -> DeviceResult<()>;
    /// How many times the host has waited for queued work so far (a
    /// `download` or `synchronize` with launches, copies or uploads queued
    /// since the last wait): a decode step should wait once.
    fn host_waits(&self) -> u64;
    /// How many of those waits were for a readback while later work was
    /// already queued behind it: the device had the next step to run while
    /// the host read this one's results.
    fn overlapped_waits(&self) -> u64;
    /// Kernels run so far, eager or in replayed graphs (not while
    /// capturing): launches and GEMMs, each GEMM once whatever cuBLAS
    /// launches for it. Per decode step, the launch gaps a step pays.
    fn kernels_run(&self) -> u64;
    /// Bytes copied from the device to the host so far (downloads and
    /// readbacks).
    fn bytes_read(&self) -> u64;
    /// Seconds the host has spent so far inside the driver's calls that
    /// queue or prepare work, by [`DriverCall`] (and any wait such a call
    /// makes itself, as an upload's for a full staging buffer or a free's
    /// for the stream), not the waits the caller asks for; `None` where no
    /// driver is called (the emulator, the null device).
    fn driver_seconds(&self) -> Option<DriverSeconds> {
        None
    }
}

/// The driver's calls whose host time [`Device::driver_seconds`] counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverCall {
    /// Kernel launches (recorded ones during a capture too).
    Launch,
    /// Products, with the timing of a new shape's algorithms.
    Gemm,
    /// Uploads.
    Upload,
    /// Readbacks queued.
    Readback,
    /// Device-to-device copies.
    Copy,
    /// Graph replays.
    Replay,
    /// Beginning and ending a capture, the graph's instantiation included.
    Capture,
    /// Allocations and frees, with the stream waits they make.
    Memory,
}

/// Seconds by [`DriverCall`], in the order of [`DriverCall::ALL`].
pub type DriverSeconds = [f64; DriverCall::ALL.len()];

impl DriverCall {
    /// Every kind, in [`DriverSeconds`]' order.
    pub const ALL: [DriverCall; 8] = [
        DriverCall::Launch,
        DriverCall::Gemm,
        DriverCall::Upload,
        DriverCall::Readback,
        DriverCall::Copy,
        DriverCall::Replay,
        DriverCall::Capture,
        DriverCall::Memory,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            DriverCall::Launch => "launch",
            DriverCall::Gemm => "gemm",
            DriverCall::Upload => "upload",
            DriverCall::Readback => "readback",
            DriverCall::Copy => "copy",
            DriverCall::Replay => "replay",
            DriverCall::Capture => "capture",
            DriverCall::Memory => "memory",
        }
    }
}

/// Calls `compile` on every module of `modules`, on as many threads as the
/// machine has (at most one a module): what [`Device::precompile`] does
/// where compiling is slow.
pub(crate) fn compile_side_by_side(modules: &[(&str, &str)], compile: impl Fn(&str, &str) + Sync) {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..threads.min(modules.len()) {
            scope.spawn(|| {
                let take = || next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                while let Some(&(name, source)) = modules.get(take()) {
                    compile(name, source);
                }
            });
        }
    });
}
