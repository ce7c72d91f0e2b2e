//! The kernel emulator: a [`Device`] on the CPU, for testing the CUDA
//! backend without a GPU (like Triton's interpreter mode or Numba's CUDA
//! simulator).
//!
//! - Memory is host memory; a device pointer is a host address. Copies are
//!   checked against the live allocations, so an out-of-bounds copy is an
//!   error instead of a corruption.
//! - A module is the same CUDA C source NVRTC compiles, compiled by the host
//!   C++ compiler (`$CXX`, else `c++`) with `kiln_emu.h` in front of it into a
//!   shared library, cached on disk by the hash of its text. Blocks run one
//!   after another; the threads of a block are fibers, so shared memory,
//!   `__syncthreads` and warp shuffles behave as on a GPU (see `kiln_emu.h`).
//! - GEMMs run on the CPU's f32 matrix product, after converting bf16/f16
//!   operands, standing in for cuBLAS.
//! - Capture records launches, copies and GEMMs with their arguments by
//!   value, as a CUDA graph does: a replay reuses the captured arguments, so a
//!   value that should have been read from device memory but was baked into a
//!   launch shows up as a wrong result, as it would on a GPU.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use half::{bf16, f16};
use sha2::{Digest, Sha256};

use super::device::{
    compile_side_by_side, Captures, Device, DeviceError, DevicePtr, DeviceResult, FunctionId, Gemm,
    GemmType, GraphId, HostWaits, KernelArg, LaunchConfig, PackedArgs, Readback, WeightLayout,
};
use super::sources::{self, inline_common_header, EMULATOR_HEADER};

/// Alignment of every allocation (as cudaMalloc's).
const ALIGN: usize = 256;

/// `kiln_emu_launch` in `kiln_emu.h`.
#[repr(C)]
struct LaunchDims {
    grid: [u32; 3],
    block: [u32; 3],
    shared_bytes: u32,
    programmatic: u32,
}

type LaunchFn = unsafe extern "C" fn(*const LaunchDims, *mut *mut c_void) -> c_int;
type LastErrorFn = unsafe extern "C" fn() -> *const c_char;

struct Function {
    name: String,
    launch: LaunchFn,
    last_error: LastErrorFn,
}

/// A host allocation: over-sized by [`ALIGN`] and aligned inside, because
/// `alloc_zeroed` with the allocator's own alignment is `calloc`, whose large
/// blocks are zero pages mapped on first touch (a KV cache of gigabytes costs
/// nothing until used), where a larger alignment would write every zero.
#[derive(Clone, Copy, Debug)]
struct HostBlock {
    base: u64,
    len: usize,
}

impl HostBlock {
    const HOST_ALIGN: usize = 16;

    fn layout(len: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(len, Self::HOST_ALIGN).expect("a valid layout")
    }

    fn free(self) {
        // SAFETY: `base` came from `alloc_zeroed` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.base as *mut u8, Self::layout(self.len)) };
    }
}

/// Work recorded during capture.
#[derive(Clone, Debug, PartialEq)]
enum Recorded {
    Launch(FunctionId, LaunchConfig, Vec<KernelArg>),
    Copy(DevicePtr, DevicePtr, usize),
    Gemm(Gemm),
}

#[derive(Default)]
struct State {
    /// Live allocations: start address → (size, the host block holding it).
    allocations: BTreeMap<u64, (usize, HostBlock)>,
    allocated: usize,
    libraries: Vec<libloading::Library>,
    functions: Vec<Function>,
    /// The work a capture records, and the captured graphs.
    captures: Captures<Vec<Recorded>>,
    /// Work issued and the host's waits; a readback holds its bytes,
    /// copied when it was queued (everything before it has run).
    waits: HostWaits<Vec<u8>>,
    /// Launches and GEMMs run ([`Device::kernels_run`]).
    kernels: u64,
}

impl State {
    /// Records `work` if a capture is in progress (returning `None`), else
    /// notes that work is pending and hands it back to run.
    fn issue(&mut self, work: Recorded) -> Option<Recorded> {
        match self.captures.current.as_mut() {
            Some(capture) => {
                capture.push(work);
                None
            }
            None => {
                self.waits.queued();
                Some(work)
            }
        }
    }
}

/// The CPU device running CUDA C kernels through the host C++ compiler.
pub struct Emulator {
    state: Mutex<State>,
    capacity: usize,
    cache_dir: PathBuf,
}

impl Emulator {
    /// An emulated device with `capacity` bytes of memory, caching compiled
    /// modules under `cache_dir`.
    pub fn new(capacity: usize, cache_dir: PathBuf) -> Self {
        Self {
            state: Mutex::new(State::default()),
            capacity,
            cache_dir,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn run(&self, work: &Recorded) -> DeviceResult<()> {
        if let Recorded::Launch(..) | Recorded::Gemm(..) = work {
            self.state().kernels += 1;
        }
        match work {
            Recorded::Launch(f, config, args) => self.run_launch(*f, *config, args),
            Recorded::Copy(dst, src, bytes) => {
                let state = self.state();
                check_range(&state, *src, *bytes, "copy source")?;
                check_range(&state, *dst, *bytes, "copy destination")?;
                // SAFETY: both ranges lie inside live allocations.
                unsafe { std::ptr::copy(*src as *const u8, *dst as *mut u8, *bytes) };
                Ok(())
            }
            Recorded::Gemm(gemm) => self.run_gemm(gemm),
        }
    }

    fn run_launch(
        &self,
        function: FunctionId,
        config: LaunchConfig,
        args: &[KernelArg],
    ) -> DeviceResult<()> {
        let (launch, last_error, name) = {
            let state = self.state();
            let f = state
                .functions
                .get(function.0)
                .ok_or_else(|| DeviceError::new(format!("no function {function:?}")))?;
            (f.launch, f.last_error, f.name.clone())
        };
        let mut packed = PackedArgs::new(args);
        let dims = LaunchDims {
            grid: [config.grid.0, config.grid.1, config.grid.2],
            block: [config.block.0, config.block.1, config.block.2],
            shared_bytes: config.shared_bytes,
            programmatic: u32::from(config.programmatic),
        };
        // SAFETY: the entry point unpacks the pointers by the kernel's own
        // signature, as cuLaunchKernel does; the caller passes arguments of
        // the kernel's types, and device pointers address live allocations.
        let rc = unsafe { launch(&dims, packed.pointers().as_mut_ptr()) };
        if rc != 0 {
            // SAFETY: the library returns a NUL-terminated thread-local buffer.
            let message = unsafe { CStr::from_ptr(last_error()) }
                .to_string_lossy()
                .into_owned();
            return Err(DeviceError::new(format!("kernel `{name}`: {message}")));
        }
        Ok(())
    }

    fn run_gemm(&self, g: &Gemm) -> DeviceResult<()> {
        {
            let state = self.state();
            check_range(&state, g.x, g.m * g.k * g.ty.size(), "gemm x")?;
            check_range(&state, g.w, g.n * g.k * g.ty.size(), "gemm w")?;
            check_range(&state, g.y, g.m * g.n * g.y_type.size(), "gemm y")?;
        }
        let read = |ptr: DevicePtr, len: usize| -> Vec<f32> {
            // SAFETY: the ranges were checked above against live allocations.
            unsafe {
                match g.ty {
                    GemmType::F32 => std::slice::from_raw_parts(ptr as *const f32, len).to_vec(),
                    GemmType::BF16 => std::slice::from_raw_parts(ptr as *const u16, len)
                        .iter()
                        .map(|&b| bf16::from_bits(b).to_f32())
                        .collect(),
                    GemmType::F16 => std::slice::from_raw_parts(ptr as *const u16, len)
                        .iter()
                        .map(|&b| f16::from_bits(b).to_f32())
                        .collect(),
                }
            }
        };
        let x = read(g.x, g.m * g.k);
        let stored = read(g.w, g.n * g.k);
        let w = match g.layout {
            WeightLayout::OutIn => stored,
            WeightLayout::InOut => {
                let mut w = vec![0f32; g.n * g.k];
                for (i, row) in stored.chunks_exact(g.n).enumerate() {
                    for (j, &v) in row.iter().enumerate() {
                        w[j * g.k + i] = v;
                    }
                }
                w
            }
        };
        let mut y = vec![0f32; g.m * g.n];
        crate::dense::matmul::linear(&x, &w, &mut y, g.m, g.k, g.n);
        // SAFETY: checked above; y does not alias x or w in a product.
        unsafe {
            match g.y_type {
                GemmType::F32 => {
                    std::slice::from_raw_parts_mut(g.y as *mut f32, y.len()).copy_from_slice(&y)
                }
                half => {
                    let out = std::slice::from_raw_parts_mut(g.y as *mut u16, y.len());
                    for (o, &v) in out.iter_mut().zip(&y) {
                        *o = match half {
                            GemmType::BF16 => bf16::from_f32(v).to_bits(),
                            _ => f16::from_f32(v).to_bits(),
                        };
                    }
                }
            }
        }
        Ok(())
    }

    /// Compiles `source` into a shared library (or finds it in the cache).
    fn compile(&self, name: &str, source: &str, kernels: &[&str]) -> DeviceResult<PathBuf> {
        let mut text = String::with_capacity(EMULATOR_HEADER.len() + source.len() + 256);
        text.push_str(EMULATOR_HEADER);
        text.push('\n');
        text.push_str(&inline_common_header(name, source));
        text.push('\n');
        for kernel in kernels {
            text.push_str(&format!("KILN_EMU_EXPORT({kernel})\n"));
        }
        let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".to_owned());
        // -fsanitize=alignment: a misaligned access fails the launch, as it
        // faults on a GPU (kiln_emu.h's handler).
        let mut flags = vec![
            "-std=c++20",
            "-O2",
            "-shared",
            "-fPIC",
            "-w",
            "-fsanitize=alignment",
            "-x",
            "c++",
        ];
        if !synchronizes(source) {
            flags.push("-DKILN_EMU_DIRECT");
        }
        let mut hasher = Sha256::new();
        hasher.update(compiler.as_bytes());
        hasher.update(flags.join(" ").as_bytes());
        hasher.update(text.as_bytes());
        let key: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let path = self.cache_dir.join(format!("{}.so", &key[..32]));
        if path.exists() {
            return Ok(path);
        }
        std::fs::create_dir_all(&self.cache_dir).map_err(|e| {
            DeviceError::new(format!("cannot create {}: {e}", self.cache_dir.display()))
        })?;
        // Unique per process and call: two threads may compile one source.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let partial = self
            .cache_dir
            .join(format!("{}.{}.{n}.tmp", &key[..32], std::process::id()));
        compile_with(&compiler, &flags, &text, &partial)
            .map_err(|e| DeviceError::new(format!("emulator: compiling {name}: {e}")))?;
        std::fs::rename(&partial, &path)
            .map_err(|e| DeviceError::new(format!("cannot write {}: {e}", path.display())))?;
        Ok(path)
    }
}

/// Whether a kernel source synchronizes its threads (barriers, shuffles,
/// votes, warp-wide tensor-core products, or the block and warp reductions
/// of `kiln_cuda.cuh` and its row norm), in its own text or in the kernel headers it includes
/// (`gemv.cuh`, the code its GEMV modules share). A module that does not
/// runs its threads as plain calls, without fibers; a barrier reached
/// anyway is reported as an error, never ignored.
fn synchronizes(source: &str) -> bool {
    let headers = sources::kernel_headers_of(source).map(|text| -> &str { text });
    std::iter::once(source).chain(headers).any(|text| {
        [
            "__syncthreads",
            "__syncwarp",
            "__shfl",
            "__any_sync",
            "block_sum",
            "block_max",
            "warp_sum",
            "warp_max",
            "write_row_normed",
            "mma_",
        ]
        .iter()
        .any(|word| text.contains(word))
    })
}

fn compile_with(compiler: &str, flags: &[&str], text: &str, out: &Path) -> Result<(), String> {
    let mut child = Command::new(compiler)
        .args(flags)
        .arg("-")
        .arg("-o")
        .arg(out)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run the C++ compiler `{compiler}` (set CXX): {e}"))?;
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(text.as_bytes())
        .map_err(|e| e.to_string())?;
    let output = child.wait_with_output().map_err(|e| e.to_string())?;
    if output.status.success() {
        return Ok(());
    }
    let log = String::from_utf8_lossy(&output.stderr);
    let first: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("error"))
        .take(5)
        .collect();
    Err(format!("{compiler} failed:\n{}", first.join("\n")))
}

fn check_range(state: &State, ptr: DevicePtr, bytes: usize, what: &str) -> DeviceResult<()> {
    if bytes == 0 {
        return Ok(());
    }
    let inside = state
        .allocations
        .range(..=ptr)
        .next_back()
        .is_some_and(|(&start, &(size, _))| ptr + bytes as u64 <= start + size as u64);
    if inside {
        Ok(())
    } else {
        Err(DeviceError::new(format!(
            "{what}: {bytes} bytes at {ptr:#x} are outside every allocation"
        )))
    }
}

impl Device for Emulator {
    fn name(&self) -> String {
        "kernel emulator (CPU)".to_owned()
    }

    fn memory(&self) -> DeviceResult<(usize, usize)> {
        Ok((
            self.capacity.saturating_sub(self.state().allocated),
            self.capacity,
        ))
    }

    fn alloc(&self, bytes: usize) -> DeviceResult<DevicePtr> {
        let mut state = self.state();
        state.captures.refuse("an allocation")?;
        if state.allocated + bytes > self.capacity {
            return Err(DeviceError::new(format!(
                "out of memory: {bytes} bytes asked, {} of {} free",
                self.capacity - state.allocated,
                self.capacity
            )));
        }
        let len = bytes.max(1) + ALIGN;
        // SAFETY: the layout has a non-zero size.
        let base = unsafe { std::alloc::alloc_zeroed(HostBlock::layout(len)) };
        if base.is_null() {
            return Err(DeviceError::new(format!(
                "out of host memory for {bytes} bytes"
            )));
        }
        let ptr = (base as u64).div_ceil(ALIGN as u64) * ALIGN as u64;
        let block = HostBlock {
            base: base as u64,
            len,
        };
        state.allocations.insert(ptr, (bytes.max(1), block));
        state.allocated += bytes;
        Ok(ptr)
    }

    fn free(&self, ptr: DevicePtr) {
        let mut state = self.state();
        if let Some((size, block)) = state.allocations.remove(&ptr) {
            state.allocated -= size.min(state.allocated);
            block.free();
        }
    }

    fn upload(&self, dst: DevicePtr, bytes: &[u8]) -> DeviceResult<()> {
        // As on a GPU, where an upload synchronizes the capturing stream.
        self.state().captures.refuse("an upload")?;
        let mut state = self.state();
        check_range(&state, dst, bytes.len(), "upload")?;
        state.waits.queued();
        // SAFETY: the destination lies inside a live allocation.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst as *mut u8, bytes.len()) };
        Ok(())
    }

    fn download(&self, src: DevicePtr, out: &mut [u8]) -> DeviceResult<()> {
        let mut state = self.state();
        state.captures.refuse("a download")?;
        state.waits.wait();
        check_range(&state, src, out.len(), "download")?;
        state.waits.bytes_read += out.len() as u64;
        // SAFETY: the source lies inside a live allocation.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn download_async(&self, parts: &[(DevicePtr, usize)]) -> DeviceResult<Readback> {
        let mut state = self.state();
        state.captures.refuse("a download")?;
        // The work before it has run (the emulator runs work as it is
        // issued), so the bytes are those a GPU's queued copy would see.
        let mut bytes = Vec::with_capacity(parts.iter().map(|p| p.1).sum());
        for &(src, len) in parts {
            check_range(&state, src, len, "download")?;
            // SAFETY: the source lies inside a live allocation.
            bytes.extend_from_slice(unsafe { std::slice::from_raw_parts(src as *const u8, len) });
        }
        state.waits.bytes_read += bytes.len() as u64;
        Ok(state.waits.queue_readback(bytes))
    }

    fn wait_readback(&self, readback: Readback) -> DeviceResult<Vec<u8>> {
        self.state().waits.wait_readback(readback)
    }

    fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> DeviceResult<()> {
        let work = self.state().issue(Recorded::Copy(dst, src, bytes));
        work.map_or(Ok(()), |work| self.run(&work))
    }

    fn precompile(&self, modules: &[(&str, &str)]) {
        compile_side_by_side(modules, |name, source| {
            let names = sources::kernel_names(source);
            let kernels: Vec<&str> = names.iter().map(String::as_str).collect();
            // Into the disk cache; a failure is `load`'s to report.
            let _ = self.compile(name, source, &kernels);
        });
    }

    fn load(&self, name: &str, source: &str, kernels: &[&str]) -> DeviceResult<Vec<FunctionId>> {
        let path = self.compile(name, source, kernels)?;
        // SAFETY: the library was just compiled from our kernel source; its
        // initializers only set up thread-local emulator state.
        let library = unsafe { libloading::Library::new(&path) }
            .map_err(|e| DeviceError::new(format!("emulator: loading {name}: {e}")))?;
        let mut state = self.state();
        let last_error: LastErrorFn = unsafe {
            // SAFETY: the symbol is defined by kiln_emu.h with this signature.
            *library
                .get::<LastErrorFn>(b"kiln_emu_last_error\0")
                .map_err(|e| DeviceError::new(format!("{name}: {e}")))?
        };
        let mut ids = Vec::with_capacity(kernels.len());
        for kernel in kernels {
            let symbol = format!("kiln_emu_launch_{kernel}\0");
            // SAFETY: KILN_EMU_EXPORT defines the symbol with this signature.
            let launch: LaunchFn = unsafe {
                *library
                    .get::<LaunchFn>(symbol.as_bytes())
                    .map_err(|e| DeviceError::new(format!("{name}: kernel `{kernel}`: {e}")))?
            };
            ids.push(FunctionId(state.functions.len()));
            state.functions.push(Function {
                name: (*kernel).to_owned(),
                launch,
                last_error,
            });
        }
        state.libraries.push(library);
        Ok(ids)
    }

    fn launch(
        &self,
        function: FunctionId,
        config: LaunchConfig,
        args: &[KernelArg],
    ) -> DeviceResult<()> {
        config.check()?;
        let work = self
            .state()
            .issue(Recorded::Launch(function, config, args.to_vec()));
        work.map_or(Ok(()), |work| self.run(&work))
    }

    fn gemm(&self, gemm: &Gemm) -> DeviceResult<()> {
        gemm.check()?;
        let work = self.state().issue(Recorded::Gemm(*gemm));
        work.map_or(Ok(()), |work| self.run(&work))
    }

    fn begin_capture(&self) -> DeviceResult<()> {
        self.state().captures.begin(Vec::new())
    }

    fn end_capture(&self) -> DeviceResult<GraphId> {
        self.state().captures.end()
    }

    fn replay(&self, graph: GraphId) -> DeviceResult<()> {
        let mut state = self.state();
        state.waits.queued();
        let work = state.captures.graph(graph)?.clone();
        drop(state);
        work.iter().try_for_each(|w| self.run(w))
    }

    fn check_replay(
        &self,
        graph: GraphId,
        record: &mut dyn FnMut() -> Result<(), String>,
    ) -> DeviceResult<bool> {
        self.begin_capture()?;
        let recorded = record();
        let now = self.state().captures.take()?;
        recorded.map_err(DeviceError::new)?;
        let state = self.state();
        let captured = state.captures.graph(graph)?;
        let name = |work: &Recorded| match work {
            Recorded::Launch(f, ..) => state
                .functions
                .get(f.0)
                .map_or_else(|| format!("kernel {}", f.0), |f| format!("`{}`", f.name)),
            Recorded::Copy(..) => "a copy".to_owned(),
            Recorded::Gemm(..) => "a GEMM".to_owned(),
        };
        if let Some(at) =
            (0..captured.len().max(now.len())).find(|&i| captured.get(i) != now.get(i))
        {
            let describe = |w: Option<&Recorded>| {
                w.map_or("nothing".to_owned(), |w| format!("{} {w:?}", name(w)))
            };
            return Err(DeviceError::new(format!(
                "a CUDA graph would replay stale work: item {at} was {} at capture, is {} now",
                describe(captured.get(at)),
                describe(now.get(at))
            )));
        }
        Ok(true)
    }

    fn release_graph(&self, graph: GraphId) {
        self.state().captures.release(graph);
    }

    fn synchronize(&self) -> DeviceResult<()> {
        let mut state = self.state();
        // As on a GPU, where waiting for a capturing stream fails.
        state.captures.refuse("a wait")?;
        state.waits.wait();
        Ok(())
    }

    fn host_waits(&self) -> u64 {
        self.state().waits.waits
    }

    fn overlapped_waits(&self) -> u64 {
        self.state().waits.overlapped
    }

    fn kernels_run(&self) -> u64 {
        self.state().kernels
    }

    fn bytes_read(&self) -> u64 {
        self.state().waits.bytes_read
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for (_, (_, block)) in std::mem::take(&mut state.allocations) {
            block.free();
        }
        // Kernel libraries hold thread-local emulator state: never unload them.
        for library in state.libraries.drain(..) {
            std::mem::forget(library);
        }
    }
}
