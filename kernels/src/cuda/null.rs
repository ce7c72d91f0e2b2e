//! A device that runs nothing: allocations are addresses with no memory
//! behind them, launches, GEMMs, copies and uploads are counted and dropped,
//! and every read gives zeros. The CUDA backend's host side (the engine's
//! scheduling and sampling parameters, the executor's binding, arena plans,
//! uploads and graph replays) then runs at its own speed, so `host benchmark
//! --device cuda-null` measures the host's share of a step at any shape,
//! an 8B model's included, on a machine without a GPU. What it leaves out is
//! the driver's own time per call (a graph replay, the step's uploads and
//! its readback: a few calls a decode step; every launch of an eager one).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use super::device::{
    Captures, Device, DeviceError, DevicePtr, DeviceResult, FunctionId, Gemm, GraphId, HostWaits,
    KernelArg, LaunchConfig, Readback,
};

/// Where the null device's addresses start (past null and small integers,
/// 256-byte aligned as cudaMalloc's are).
const FIRST_ADDRESS: DevicePtr = 1 << 40;
const ALIGN: u64 = 256;

/// A device that runs nothing (see the module's documentation).
pub struct NullDevice {
    capacity: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next_address: DevicePtr,
    /// Live allocations: address → bytes.
    allocations: HashMap<DevicePtr, usize>,
    allocated: usize,
    functions: usize,
    /// Kernels counted in the capture in progress, and in each graph.
    captures: Captures<u64>,
    /// Work issued and the host's waits; a readback holds its byte count.
    waits: HostWaits<usize>,
    kernels_run: u64,
}

impl State {
    /// Counts one piece of work issued, and `kernels` kernels run unless a
    /// capture records them.
    fn issue(&mut self, kernels: u64) {
        match &mut self.captures.current {
            Some(captured) => *captured += kernels,
            None => {
                self.waits.queued();
                self.kernels_run += kernels;
            }
        }
    }
}

impl NullDevice {
    /// A null device reporting `capacity` bytes of memory.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            state: Mutex::new(State {
                next_address: FIRST_ADDRESS,
                ..State::default()
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Device for NullDevice {
    fn name(&self) -> String {
        "null device (runs nothing: host time only)".to_owned()
    }

    fn computes(&self) -> bool {
        false
    }

    fn memory(&self) -> DeviceResult<(usize, usize)> {
        let state = self.state();
        Ok((self.capacity.saturating_sub(state.allocated), self.capacity))
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
        let ptr = state.next_address;
        state.next_address += (bytes.max(1) as u64).div_ceil(ALIGN) * ALIGN;
        state.allocations.insert(ptr, bytes);
        state.allocated += bytes;
        Ok(ptr)
    }

    fn free(&self, ptr: DevicePtr) {
        let mut state = self.state();
        if let Some(bytes) = state.allocations.remove(&ptr) {
            state.allocated -= bytes.min(state.allocated);
        }
    }

    fn upload(&self, _dst: DevicePtr, _bytes: &[u8]) -> DeviceResult<()> {
        let mut state = self.state();
        state.captures.refuse("an upload")?;
        state.issue(0);
        Ok(())
    }

    fn download(&self, _src: DevicePtr, out: &mut [u8]) -> DeviceResult<()> {
        let mut state = self.state();
        state.captures.refuse("a download")?;
        state.waits.wait();
        state.waits.bytes_read += out.len() as u64;
        out.fill(0);
        Ok(())
    }

    fn download_async(&self, parts: &[(DevicePtr, usize)]) -> DeviceResult<Readback> {
        let mut state = self.state();
        state.captures.refuse("a download")?;
        let bytes: usize = parts.iter().map(|p| p.1).sum();
        state.waits.bytes_read += bytes as u64;
        Ok(state.waits.queue_readback(bytes))
    }

    fn wait_readback(&self, readback: Readback) -> DeviceResult<Vec<u8>> {
        let bytes = self.state().waits.wait_readback(readback)?;
        Ok(vec![0; bytes])
    }

    fn copy(&self, _dst: DevicePtr, _src: DevicePtr, _bytes: usize) -> DeviceResult<()> {
        self.state().issue(0);
        Ok(())
    }

    fn load(&self, _name: &str, _source: &str, kernels: &[&str]) -> DeviceResult<Vec<FunctionId>> {
        let mut state = self.state();
        let first = state.functions;
        state.functions += kernels.len();
        Ok((first..state.functions).map(FunctionId).collect())
    }

    fn launch(
        &self,
        function: FunctionId,
        config: LaunchConfig,
        _args: &[KernelArg],
    ) -> DeviceResult<()> {
        config.check()?;
        let mut state = self.state();
        if function.0 >= state.functions {
            return Err(DeviceError::new(format!("no kernel {function:?}")));
        }
        state.issue(1);
        Ok(())
    }

    fn gemm(&self, gemm: &Gemm) -> DeviceResult<()> {
        gemm.check()?;
        self.state().issue(1);
        Ok(())
    }

    fn begin_capture(&self) -> DeviceResult<()> {
        self.state().captures.begin(0)
    }

    fn end_capture(&self) -> DeviceResult<GraphId> {
        self.state().captures.end()
    }

    fn replay(&self, graph: GraphId) -> DeviceResult<()> {
        let mut state = self.state();
        let kernels = *state.captures.graph(graph)?;
        state.issue(kernels);
        Ok(())
    }

    fn release_graph(&self, graph: GraphId) {
        self.state().captures.release(graph);
    }

    fn synchronize(&self) -> DeviceResult<()> {
        let mut state = self.state();
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
        self.state().kernels_run
    }

    fn bytes_read(&self) -> u64 {
        self.state().waits.bytes_read
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_work_and_reads_zeros() {
        let device = NullDevice::new(1 << 30);
        let a = device.alloc(100).unwrap();
        let b = device.alloc(10).unwrap();
        assert_eq!((a % ALIGN, b - a), (0, ALIGN));
        assert_eq!(device.memory().unwrap(), ((1 << 30) - 110, 1 << 30));
        let f = device.load("m", "", &["k1", "k2"]).unwrap();
        assert_eq!(f, vec![FunctionId(0), FunctionId(1)]);
        let config = LaunchConfig::linear(1, 32);
        device.launch(f[1], config, &[]).unwrap();
        assert!(device.launch(FunctionId(2), config, &[]).is_err());
        device.begin_capture().unwrap();
        device.launch(f[0], config, &[]).unwrap();
        device.launch(f[1], config, &[]).unwrap();
        assert!(device.upload(a, &[1]).is_err(), "no upload in a capture");
        assert!(device.synchronize().is_err(), "no wait in a capture");
        let graph = device.end_capture().unwrap();
        assert_eq!(device.kernels_run(), 1, "captured kernels do not run");
        device.replay(graph).unwrap();
        assert_eq!(device.kernels_run(), 3);
        device.upload(a, &[7; 4]).unwrap();
        let readback = device.download_async(&[(a, 4), (b, 2)]).unwrap();
        device.launch(f[0], config, &[]).unwrap();
        assert_eq!(device.wait_readback(readback).unwrap(), vec![0; 6]);
        assert_eq!((device.host_waits(), device.overlapped_waits()), (1, 1));
        device.free(a);
        assert_eq!(device.memory().unwrap().0, (1 << 30) - 10);
        device.release_graph(graph);
        assert!(device.replay(graph).is_err());
    }

    #[test]
    fn gemms_store_what_cublas_can() {
        use crate::cuda::{GemmType, WeightLayout};
        let device = NullDevice::new(1 << 20);
        let gemm = |ty, y_type| Gemm {
            m: 1,
            n: 1,
            k: 1,
            ty,
            x: FIRST_ADDRESS,
            w: FIRST_ADDRESS,
            layout: WeightLayout::OutIn,
            y: FIRST_ADDRESS,
            y_type,
        };
        use GemmType::{BF16, F16, F32};
        for (ty, y_type) in [
            (F32, F32),
            (BF16, F32),
            (BF16, BF16),
            (F16, F32),
            (F16, F16),
        ] {
            device.gemm(&gemm(ty, y_type)).unwrap();
        }
        for (ty, y_type) in [(F32, BF16), (BF16, F16), (F16, BF16)] {
            let err = device.gemm(&gemm(ty, y_type)).unwrap_err().to_string();
            assert!(err.contains("cannot store"), "{err}");
        }
    }
}
