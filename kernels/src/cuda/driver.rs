//! The real GPU: a [`Device`] on the CUDA driver, NVRTC and cuBLAS, all
//! loaded at run time through cudarc (the binary needs none of them to build
//! or to run on the CPU). One context, one non-default stream (CUDA graph
//! capture needs one), cudarc's event tracking off (capture fails with
//! `CUDA_ERROR_STREAM_CAPTURE_ISOLATION` otherwise).

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::cublas::{result as cublas, sys as cublas_sys};
use cudarc::driver::{result, sys, CudaContext, CudaStream};

use super::captures::{outside_captures, Capture};
use super::cubin_cache::CubinCache;
use super::cublas::{self as products, GemmAlgorithms, Route};
use super::device::{
    compile_side_by_side, Device, DeviceError, DevicePtr, DeviceResult, DriverCall, DriverSeconds,
    FunctionId, Gemm, GraphId, KernelArg, LaunchConfig, PackedArgs, Readback,
};
use super::driver_launch::{launch_programmatic, opt_in_shared};
use super::nvrtc;
use super::pinned::{self, ReadbackSlot, Staging};

/// Which CUDA library is missing, if any, in the order they are needed.
pub fn missing_library() -> Option<&'static str> {
    // SAFETY: each probe only tries to open a library by its known names.
    unsafe {
        if !sys::is_culib_present() {
            return Some("the CUDA driver (libcuda.so, driver 580+ for CUDA 13)");
        }
        if !cudarc::nvrtc::sys::is_culib_present() {
            return Some("libnvrtc.so.13 (pip install nvidia-cuda-nvrtc==13.0.88)");
        }
        if !cublas_sys::is_culib_present() {
            return Some("libcublas.so.13 (pip install nvidia-cublas)");
        }
    }
    None
}

struct Inner {
    /// Loaded modules (unloaded in `Drop`) and their kernels.
    modules: Vec<sys::CUmodule>,
    functions: Vec<sys::CUfunction>,
    /// Each function's opt-in to dynamic shared memory past 48 KiB
    /// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`), by index: the
    /// largest asked for so far (0: none).
    shared_opt_in: Vec<u32>,
    /// Instantiated graphs and their kernels (`None` once released).
    graphs: Vec<Option<(sys::CUgraphExec, u64)>>,
    staging: Staging,
    /// Pinned buffers that readbacks land in.
    readbacks: Vec<ReadbackSlot>,
    /// Work was queued since the host last waited.
    pending: bool,
    /// Waits for queued work ([`Device::host_waits`]).
    waits: u64,
    /// Work queued so far (launches, copies, uploads, replays, readbacks).
    issued: u64,
    /// Readback waits with later work queued ([`Device::overlapped_waits`]).
    overlapped: u64,
    /// Kernels queued to run ([`Device::kernels_run`]).
    kernels: u64,
    /// Bytes copied to the host ([`Device::bytes_read`]).
    bytes_read: u64,
    /// Kernels recorded by the capture in progress.
    captured_kernels: Option<u64>,
    /// The capture in progress, known to the process's other threads.
    capture: Option<Capture>,
}

impl Inner {
    /// Notes that work was queued on the stream (work a capture records
    /// is not queued: it runs when the graph is replayed).
    fn queued(&mut self) {
        if self.captured_kernels.is_none() {
            self.pending = true;
            self.issued += 1;
        }
    }

    /// Fails for what a stream capture must not record (a CUDA graph
    /// holds no uploads, readbacks, waits or allocations).
    fn refuse_in_capture(&self, what: &str) -> DeviceResult<()> {
        match self.captured_kernels {
            Some(_) => Err(DeviceError::new(format!("{what} cannot be captured"))),
            None => Ok(()),
        }
    }

    /// Notes a launch or GEMM: run, or recorded by a capture.
    fn kernel(&mut self) {
        match &mut self.captured_kernels {
            Some(captured) => *captured += 1,
            None => self.kernels += 1,
        }
    }
}

/// CUDA device `ordinal` through the driver.
pub struct CudaDevice {
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    cublas: cublas_sys::cublasHandle_t,
    /// cuBLAS's workspace (freed in `Drop`, after the handle).
    workspace: DevicePtr,
    /// Products of decode's and prefill chunks' row counts in the cuBLASLt
    /// algorithm timed
    /// fastest (`None`: `GemmEx` for all).
    gemm_algorithms: Option<GemmAlgorithms>,
    /// Programmatic dependent launch (compute capability 9.0 and newer).
    programmatic: bool,
    name: String,
    /// Compiled modules on disk.
    cubins: CubinCache,
    /// Images `precompile` made or read, by their cache path, until loaded.
    precompiled: Mutex<HashMap<PathBuf, Vec<u8>>>,
    inner: Mutex<Inner>,
    /// Nanoseconds spent in the driver's calls, by [`DriverCall`]
    /// ([`Device::driver_seconds`]).
    driver_nanos: [AtomicU64; DriverCall::ALL.len()],
}

// SAFETY: the raw handles (cuBLAS handle, functions, graphs) are only used
// with the context bound on the calling thread and behind `inner`'s lock or
// the stream's ordering; CUDA allows their use from any thread.
unsafe impl Send for CudaDevice {}
// SAFETY: as above.
unsafe impl Sync for CudaDevice {}

pub(super) fn driver_error(what: &str) -> impl Fn(result::DriverError) -> DeviceError + '_ {
    move |e| DeviceError::new(format!("{what}: {e}"))
}

impl CudaDevice {
    /// Runs `call`, a call into the driver of kind `kind`, counting its time
    /// ([`Device::driver_seconds`]).
    fn timed<T>(&self, kind: DriverCall, call: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let result = call();
        let nanos = started.elapsed().as_nanos() as u64;
        self.driver_nanos[kind as usize].fetch_add(nanos, Ordering::Relaxed);
        result
    }

    /// Opens device `ordinal`, caching NVRTC's output under `cache_dir`;
    /// with `time_gemm_algorithms`, products of decode's and prefill chunks'
    /// row counts run in
    /// the cuBLASLt algorithm timed fastest (`cublas.rs`), else all
    /// by `GemmEx`. Errors name the missing library or the driver's failure.
    pub fn open(
        ordinal: usize,
        cache_dir: PathBuf,
        time_gemm_algorithms: bool,
    ) -> DeviceResult<Self> {
        if let Some(missing) = missing_library() {
            return Err(DeviceError::new(format!("{missing} could not be loaded")));
        }
        // cuBLAS and the staging memory allocate (captures.rs).
        outside_captures(|| Self::open_context(ordinal, cache_dir, time_gemm_algorithms))
    }

    /// [`CudaDevice::open`] once its libraries are known to load.
    fn open_context(
        ordinal: usize,
        cache_dir: PathBuf,
        time_gemm_algorithms: bool,
    ) -> DeviceResult<Self> {
        let context = CudaContext::new(ordinal).map_err(driver_error("opening the device"))?;
        // Must precede every allocation, or stream capture fails.
        // SAFETY: no buffer has been allocated on this context yet.
        unsafe { context.disable_event_tracking() };
        let stream = context
            .new_stream()
            .map_err(driver_error("creating a stream"))?;
        let (major, minor) = context
            .compute_capability()
            .map_err(driver_error("compute capability"))?;
        let arch = nvrtc::arch_of(major, minor).ok_or_else(|| {
            DeviceError::new(format!(
                "compute capability {major}.{minor} is not supported (sm_80 or newer)"
            ))
        })?;
        let name = context.name().map_err(driver_error("device name"))?;
        let (handle, workspace) = products::cublas_on(&stream)?;
        let gemm_algorithms = match time_gemm_algorithms {
            true => products::gemm_algorithms_on(&context),
            false => None,
        };
        Ok(Self {
            context,
            stream,
            cublas: handle,
            gemm_algorithms,
            programmatic: major >= 9,
            name: format!("{name} ({arch})"),
            cubins: CubinCache::new(cache_dir, arch),
            precompiled: Mutex::default(),
            workspace,
            inner: Mutex::new(Inner {
                modules: Vec::new(),
                functions: Vec::new(),
                shared_opt_in: Vec::new(),
                graphs: Vec::new(),
                staging: Staging::new(),
                readbacks: Vec::new(),
                pending: false,
                waits: 0,
                issued: 0,
                overlapped: 0,
                kernels: 0,
                bytes_read: 0,
                captured_kernels: None,
                capture: None,
            }),
            driver_nanos: Default::default(),
        })
    }

    /// Fails for what a stream capture must not record.
    fn refuse_in_capture(&self, what: &str) -> DeviceResult<()> {
        self.inner().refuse_in_capture(what)
    }

    fn bind(&self) -> DeviceResult<()> {
        self.context
            .bind_to_thread()
            .map_err(driver_error("binding the context"))
    }

    /// The module's cubin: made by `precompile`, else from the disk cache,
    /// else compiled by NVRTC and stored.
    fn cubin(&self, name: &str, source: &str) -> DeviceResult<Vec<u8>> {
        self.cubin_at(&self.cubins.path(name, source)?, name, source)
    }

    /// [`CudaDevice::cubin`], its cache path `path` known.
    fn cubin_at(&self, path: &Path, name: &str, source: &str) -> DeviceResult<Vec<u8>> {
        let precompiled = self
            .precompiled
            .lock()
            .ok()
            .and_then(|mut p| p.remove(path));
        match precompiled {
            Some(image) => Ok(image),
            None => self.cubins.image(path, name, source),
        }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes that work is queued on the stream.
    fn queued(&self) {
        self.inner().queued();
    }

    /// Waits for the stream (with `inner` locked, so no upload is staged
    /// meanwhile) and reclaims the staging memory.
    fn wait(&self, inner: &mut Inner) -> DeviceResult<()> {
        // SAFETY: the stream is live.
        unsafe { result::stream::synchronize(self.stream.cu_stream()) }
            .map_err(driver_error("cuStreamSynchronize"))?;
        if std::mem::take(&mut inner.pending) {
            inner.waits += 1;
        }
        inner.staging.used = 0;
        Ok(())
    }
}

impl Device for CudaDevice {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn memory(&self) -> DeviceResult<(usize, usize)> {
        self.bind()?;
        result::mem_get_info().map_err(driver_error("cuMemGetInfo"))
    }

    fn alloc(&self, bytes: usize) -> DeviceResult<DevicePtr> {
        self.timed(DriverCall::Memory, || {
            self.refuse_in_capture("an allocation")?;
            self.bind()?;
            // SAFETY: a plain allocation, zeroed on our stream (so later kernels
            // on it see the zeros) before it is handed out.
            outside_captures(|| unsafe {
                let ptr = result::malloc_sync(bytes.max(1))
                    .map_err(|e| DeviceError::new(format!("allocating {bytes} bytes: {e}")))?;
                result::memset_d8_async(ptr, 0, bytes.max(1), self.stream.cu_stream())
                    .map_err(driver_error("cuMemsetD8Async"))?;
                result::stream::synchronize(self.stream.cu_stream())
                    .map_err(driver_error("sync"))?;
                Ok(ptr)
            })
        })
    }

    fn free(&self, ptr: DevicePtr) {
        self.timed(DriverCall::Memory, || {
            if self.bind().is_ok() {
                // Queued work may still read it (frees are rare: at load, when
                // the arena grows, at exit); a capturing stream cannot be waited
                // for.
                let capturing = self.inner().captured_kernels.is_some();
                // SAFETY: the stream is live; `ptr` came from `alloc` and is
                // freed once.
                outside_captures(|| unsafe {
                    if !capturing {
                        let _ = result::stream::synchronize(self.stream.cu_stream());
                    }
                    let _ = result::free_sync(ptr);
                })
            }
        })
    }

    fn upload(&self, dst: DevicePtr, bytes: &[u8]) -> DeviceResult<()> {
        self.timed(DriverCall::Upload, || {
            if bytes.is_empty() {
                return Ok(());
            }
            self.bind()?;
            let mut inner = self.inner();
            inner.refuse_in_capture("an upload")?;
            inner.queued();
            let stream = self.stream.cu_stream();
            let len = bytes.len();
            if len > inner.staging.capacity {
                // On our stream, so the kernels queued after it read the new
                // bytes; the wait keeps `bytes` alive until the copy is done.
                // SAFETY: `dst` addresses a live allocation of at least `len`.
                unsafe { result::memcpy_htod_async(dst, bytes, stream) }
                    .map_err(driver_error("host to device copy"))?;
                return self.wait(&mut inner);
            }
            if inner.staging.used + len > inner.staging.capacity {
                self.wait(&mut inner)?;
            }
            let at = inner.staging.used;
            // SAFETY: `at + len` fits the staging buffer, whose bytes from `at`
            // on no queued copy reads any more (they were reclaimed by a wait);
            // `dst` addresses a live allocation of at least `len`.
            unsafe {
                let staged = inner.staging.base.add(at);
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), staged, len);
                result::memcpy_htod_async(dst, std::slice::from_raw_parts(staged, len), stream)
            }
            .map_err(driver_error("host to device copy"))?;
            // 256-byte aligned, as the DMA engine prefers.
            inner.staging.used = (at + len).next_multiple_of(256);
            Ok(())
        })
    }

    fn download(&self, src: DevicePtr, out: &mut [u8]) -> DeviceResult<()> {
        self.refuse_in_capture("a download")?;
        self.bind()?;
        let mut inner = self.inner();
        self.wait(&mut inner)?;
        inner.bytes_read += out.len() as u64;
        drop(inner);
        // SAFETY: the stream's work is finished before the copy.
        unsafe { result::memcpy_dtoh_sync(out, src) }.map_err(driver_error("device to host copy"))
    }

    fn download_async(&self, parts: &[(DevicePtr, usize)]) -> DeviceResult<Readback> {
        self.timed(DriverCall::Readback, || {
            self.bind()?;
            let mut inner = self.inner();
            inner.refuse_in_capture("a download")?;
            let total: usize = parts.iter().map(|p| p.1).sum();
            let index = pinned::readback_slot(&mut inner.readbacks, total)?;
            let stream = self.stream.cu_stream();
            let slot = &inner.readbacks[index];
            let mut at = 0;
            for &(src, len) in parts {
                // SAFETY: `at + len` fits the slot's pinned memory, which no
                // other queued copy writes (the slot is free); `src` addresses a
                // live allocation of at least `len` (the caller's plan).
                let copied = unsafe {
                    let dst = std::slice::from_raw_parts_mut(slot.base.add(at), len);
                    result::memcpy_dtoh_async(dst, src, stream)
                };
                if let Err(e) = copied {
                    // The copies queued before it write the slot, which stays
                    // free: they must be done before it is reused or freed.
                    // SAFETY: the stream is live.
                    let _ = unsafe { result::stream::synchronize(stream) };
                    return Err(driver_error("device to host copy")(e));
                }
                at += len;
            }
            // SAFETY: the event and the stream are live.
            unsafe { result::event::record(slot.event, stream) }
                .map_err(driver_error("cuEventRecord"))?;
            let issued = inner.issued;
            inner.readbacks[index].in_use = Some((total, issued));
            inner.bytes_read += total as u64;
            inner.queued();
            Ok(Readback(index))
        })
    }

    fn wait_readback(&self, readback: Readback) -> DeviceResult<Vec<u8>> {
        self.bind()?;
        let mut inner = self.inner();
        let slot = inner
            .readbacks
            .get_mut(readback.0)
            .filter(|s| s.in_use.is_some())
            .ok_or_else(|| DeviceError::new(format!("no readback {}", readback.0)))?;
        // SAFETY: the event was recorded after the readback's copies.
        unsafe { result::event::synchronize(slot.event) }
            .map_err(driver_error("cuEventSynchronize"))?;
        let (len, issued_before) = slot.in_use.take().expect("checked in use");
        // SAFETY: the copies into the first `len` bytes are done.
        let bytes = unsafe { std::slice::from_raw_parts(slot.base, len) }.to_vec();
        inner.waits += 1;
        if inner.issued > issued_before + 1 {
            inner.overlapped += 1;
        } else {
            // Nothing was queued after it: the stream is idle, and every
            // staged upload has been copied.
            inner.pending = false;
            inner.staging.used = 0;
        }
        Ok(bytes)
    }

    fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> DeviceResult<()> {
        self.timed(DriverCall::Copy, || {
            self.bind()?;
            self.queued();
            // SAFETY: both ranges belong to live allocations (the caller's plan).
            unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }
                .map_err(driver_error("device to device copy"))
        })
    }

    fn precompile(&self, modules: &[(&str, &str)]) {
        compile_side_by_side(modules, |name, source| {
            // A failure is `load`'s to report, with its context.
            let Ok(path) = self.cubins.path(name, source) else {
                return;
            };
            if let Ok(image) = self.cubin_at(&path, name, source) {
                if let Ok(mut precompiled) = self.precompiled.lock() {
                    precompiled.insert(path, image);
                }
            }
        });
    }

    fn load(&self, name: &str, source: &str, kernels: &[&str]) -> DeviceResult<Vec<FunctionId>> {
        self.bind()?;
        let image = self.cubin(name, source)?;
        // SAFETY: the image is a cubin NVRTC made for this device.
        let loaded = outside_captures(|| unsafe {
            result::module::load_data(image.as_ptr().cast::<c_void>())
        });
        let module = match loaded {
            Ok(module) => module,
            // A damaged cached image: compiled again, once.
            Err(_) => {
                let _ = std::fs::remove_file(self.cubins.path(name, source)?);
                let image = self.cubin(name, source)?;
                // SAFETY: as above, freshly compiled.
                outside_captures(|| unsafe {
                    result::module::load_data(image.as_ptr().cast::<c_void>())
                })
                .map_err(driver_error("loading a module"))?
            }
        };
        let mut inner = self.inner();
        inner.modules.push(module);
        let mut ids = Vec::with_capacity(kernels.len());
        for kernel in kernels {
            let c_name =
                std::ffi::CString::new(*kernel).map_err(|_| DeviceError::new("bad name"))?;
            // SAFETY: the module is live (unloaded in `Drop`).
            let function = unsafe { result::module::get_function(module, c_name) }
                .map_err(|e| DeviceError::new(format!("{name}: kernel `{kernel}`: {e}")))?;
            ids.push(FunctionId(inner.functions.len()));
            inner.functions.push(function);
            inner.shared_opt_in.push(0);
        }
        Ok(ids)
    }

    fn launch(
        &self,
        function: FunctionId,
        config: LaunchConfig,
        args: &[KernelArg],
    ) -> DeviceResult<()> {
        self.timed(DriverCall::Launch, || {
            config.check()?;
            self.bind()?;
            let f = {
                let mut inner = self.inner();
                let f = *inner
                    .functions
                    .get(function.0)
                    .ok_or_else(|| DeviceError::new(format!("no function {function:?}")))?;
                opt_in_shared(&mut inner.shared_opt_in, function, f, config.shared_bytes)?;
                inner.queued();
                inner.kernel();
                f
            };
            let mut packed = PackedArgs::new(args);
            if config.programmatic && self.programmatic {
                return launch_programmatic(self.stream.cu_stream(), f, config, &mut packed);
            }
            // SAFETY: the arguments match the kernel's signature (the backend
            // builds them from the same definitions); cuLaunchKernel copies them.
            unsafe {
                result::launch_kernel(
                    f,
                    config.grid,
                    config.block,
                    config.shared_bytes,
                    self.stream.cu_stream(),
                    packed.pointers(),
                )
            }
            .map_err(driver_error("cuLaunchKernel"))
        })
    }

    fn gemm(&self, g: &Gemm) -> DeviceResult<()> {
        self.timed(DriverCall::Gemm, || {
            g.check()?;
            self.bind()?;
            let capturing = {
                let mut inner = self.inner();
                inner.queued();
                inner.kernel();
                inner.captured_kernels.is_some()
            };
            let gemm_ex = || products::gemm_ex(self.cublas, g);
            match &self.gemm_algorithms {
                Some(algorithms) => {
                    let route = Route {
                        stream: self.stream.cu_stream(),
                        workspace: (self.workspace, products::CUBLAS_WORKSPACE),
                        gemm_ex: &gemm_ex,
                    };
                    algorithms.run(g, capturing, &route)
                }
                None => gemm_ex(),
            }
        })
    }

    fn times_products(&self) -> bool {
        self.gemm_algorithms.is_some()
    }

    fn begin_capture(&self) -> DeviceResult<()> {
        self.timed(DriverCall::Capture, || {
            self.bind()?;
            let capture = Capture::begin();
            // SAFETY: the stream is live and not the legacy default stream.
            unsafe {
                result::stream::begin_capture(
                    self.stream.cu_stream(),
                    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                )
            }
            .map_err(driver_error("cuStreamBeginCapture"))?;
            let mut inner = self.inner();
            inner.captured_kernels = Some(0);
            inner.capture = Some(capture);
            Ok(())
        })
    }

    fn end_capture(&self) -> DeviceResult<GraphId> {
        self.timed(DriverCall::Capture, || {
            self.bind()?;
            let (kernels, capture) = {
                let mut inner = self.inner();
                (
                    inner.captured_kernels.take().unwrap_or(0),
                    inner.capture.take(),
                )
            };
            // SAFETY: a capture is in progress on this stream.
            let exec = unsafe {
                let graph = result::stream::end_capture(self.stream.cu_stream());
                drop(capture);
                let graph = graph.map_err(driver_error("cuStreamEndCapture"))?;
                let exec = result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0));
                let _ = result::graph::destroy(graph);
                exec.map_err(driver_error("cuGraphInstantiate"))?
            };
            let mut inner = self.inner();
            inner.graphs.push(Some((exec, kernels)));
            Ok(GraphId(inner.graphs.len() - 1))
        })
    }

    fn replay(&self, graph: GraphId) -> DeviceResult<()> {
        self.timed(DriverCall::Replay, || {
            self.bind()?;
            self.queued();
            let (exec, kernels) = self
                .inner()
                .graphs
                .get(graph.0)
                .copied()
                .flatten()
                .ok_or_else(|| DeviceError::new(format!("no graph {graph:?}")))?;
            self.inner().kernels += kernels;
            // SAFETY: the graph was instantiated on this context.
            unsafe { result::graph::launch(exec, self.stream.cu_stream()) }
                .map_err(driver_error("cuGraphLaunch"))
        })
    }

    fn release_graph(&self, graph: GraphId) {
        let exec = self.inner().graphs.get_mut(graph.0).and_then(Option::take);
        if let (Some((exec, _)), Ok(())) = (exec, self.bind()) {
            // SAFETY: the graph was instantiated here and is destroyed once.
            let _ = unsafe { result::graph::exec_destroy(exec) };
        }
    }

    fn profiler(&self, on: bool) -> DeviceResult<()> {
        self.bind()?;
        // SAFETY: plain driver calls on the current context.
        let status = unsafe {
            if on {
                sys::cuProfilerStart()
            } else {
                sys::cuProfilerStop()
            }
        };
        status.result().map_err(driver_error(if on {
            "cuProfilerStart"
        } else {
            "cuProfilerStop"
        }))
    }

    fn synchronize(&self) -> DeviceResult<()> {
        self.refuse_in_capture("a wait")?;
        self.bind()?;
        self.wait(&mut self.inner())
    }

    fn host_waits(&self) -> u64 {
        self.inner().waits
    }

    fn overlapped_waits(&self) -> u64 {
        self.inner().overlapped
    }

    fn kernels_run(&self) -> u64 {
        self.inner().kernels
    }

    fn bytes_read(&self) -> u64 {
        self.inner().bytes_read
    }

    fn driver_seconds(&self) -> Option<DriverSeconds> {
        Some(
            self.driver_nanos
                .each_ref()
                .map(|n| n.load(Ordering::Relaxed) as f64 * 1e-9),
        )
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // Frees memory, unloads modules (captures.rs).
        outside_captures(|| self.release());
    }
}

impl CudaDevice {
    /// Everything the device holds, given back to the driver.
    fn release(&mut self) {
        if self.bind().is_ok() {
            // SAFETY: the stream is live; after this no copy reads the
            // staging memory.
            let _ = unsafe { result::stream::synchronize(self.stream.cu_stream()) };
            let inner = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
            if !inner.staging.base.is_null() {
                // SAFETY: pinned in `Staging::new`, freed once.
                let _ = unsafe { result::free_host(inner.staging.base.cast()) };
            }
            for slot in inner.readbacks.drain(..) {
                // SAFETY: pinned and created in `readback_slot`, freed once.
                unsafe {
                    let _ = result::free_host(slot.base.cast());
                    let _ = result::event::destroy(slot.event);
                }
            }
            for &(exec, _) in inner.graphs.iter().flatten() {
                // SAFETY: each graph was instantiated here and is destroyed once.
                let _ = unsafe { result::graph::exec_destroy(exec) };
            }
            for &module in &inner.modules {
                // SAFETY: each module was loaded here and is unloaded once.
                let _ = unsafe { result::module::unload(module) };
            }
            // cuBLASLt's handle, events and flush buffer, with the context bound.
            drop(self.gemm_algorithms.take());
            // SAFETY: the handle and its workspace were created in `open`;
            // the handle goes first.
            unsafe {
                let _ = cublas::destroy_handle(self.cublas);
                let _ = result::free_sync(self.workspace);
            }
        }
    }
}
