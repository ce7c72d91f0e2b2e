//! CUDA graphs of whole steps. Once a binding of the symbolic sizes has a
//! plan, every launch of a step with that binding is the same (the same
//! kernels, the same arguments, the same addresses: inputs are uploaded into
//! the same arena slots before the launches), so the step can be captured
//! and replayed with one call instead of hundreds of launches. A binding is
//! captured the second time it runs (the first run is eager: compilation,
//! cuBLAS's own set-up) and replayed from then on; past [`MAX_GRAPHS`]
//! captured bindings, the cache starts over. Decode steps are padded to a
//! few bindings first (`buckets.rs`). Steps of more than
//! [`MAX_CAPTURED_ROWS`] tokens always run eagerly. `--enforce-eager` turns
//! this off.

use std::collections::HashMap;

use kiln_kernels::cuda::{Device, GraphId};

/// Bindings captured at most.
pub const MAX_GRAPHS: usize = 256;

/// Steps of more tokens than this (rows of the graph's first input, the
/// decoder's token ids) are never captured, as vLLM captures batches of at
/// most 512 tokens by default. Their kernels run long enough that launching
/// them one by one costs the GPU nothing (the host queues a 2048-token
/// Llama-3-8B prefill's 388 launches in ~1.5 ms of its ~50 ms of kernels),
/// while capturing one keeps the GPU idle as the host records, instantiates
/// and uploads the graph (that prefill's captured second run took 8.3 ms of
/// host time on the H200, `bench/results/gpu-2026-11-30b`, against 0.2 ms
/// on the null device, whose capture costs nothing), for a prompt length
/// that may never come again.
pub const MAX_CAPTURED_ROWS: usize = 512;

/// Whether a step of `rows` tokens may be captured.
pub fn capturable(rows: usize) -> bool {
    rows <= MAX_CAPTURED_ROWS
}

/// What a step's binding (sorted symbol values, and the KV cache it writes)
/// has so far.
#[derive(Clone, Copy, Debug)]
enum Slot {
    /// Ran once, eagerly.
    Seen,
    /// Captured.
    Captured(GraphId),
}

/// A binding: the sorted symbol values, and the KV cache the step writes
/// (its address, bytes per layer, layers and block size: everything of the
/// cache a launch argument is made of).
pub type GraphKey = (Vec<(String, usize)>, [u64; 4]);

/// Captured steps by binding.
#[derive(Default)]
pub struct GraphCache {
    slots: HashMap<GraphKey, Slot>,
    captured: usize,
}

impl GraphCache {
    /// Runs a step: `launch` issues its work. Replays the binding's graph if
    /// there is one (on the kernel emulator, after checking that `launch`
    /// would issue exactly the captured work), captures it on its second run,
    /// else launches eagerly.
    pub fn run(
        &mut self,
        device: &dyn Device,
        key: GraphKey,
        mut launch: impl FnMut() -> Result<(), String>,
    ) -> Result<(), String> {
        match self.slots.get(&key).copied() {
            Some(Slot::Captured(graph)) => {
                device
                    .check_replay(graph, &mut launch)
                    .map_err(|e| e.to_string())?;
                device.replay(graph).map_err(|e| e.to_string())
            }
            Some(Slot::Seen) => {
                if self.captured >= MAX_GRAPHS {
                    // Full (bindings come and go, caches are freed): start over.
                    self.clear(device);
                    self.slots.insert(key.clone(), Slot::Seen);
                }
                device.begin_capture().map_err(|e| e.to_string())?;
                let launched = launch();
                let graph = match (launched, device.end_capture()) {
                    (Ok(()), Ok(graph)) => graph,
                    (Err(e), Ok(graph)) => {
                        device.release_graph(graph);
                        return Err(e);
                    }
                    (Err(e), Err(_)) => return Err(e),
                    (Ok(()), Err(e)) => return Err(e.to_string()),
                };
                self.slots.insert(key, Slot::Captured(graph));
                self.captured += 1;
                device.replay(graph).map_err(|e| e.to_string())
            }
            None => {
                launch()?;
                self.slots.insert(key, Slot::Seen);
                Ok(())
            }
        }
    }

    /// How many bindings are captured.
    pub fn captured(&self) -> usize {
        self.captured
    }

    /// Forgets every graph (their addresses are gone: the arena moved).
    pub fn clear(&mut self, device: &dyn Device) {
        for slot in self.slots.values() {
            if let Slot::Captured(graph) = slot {
                device.release_graph(*graph);
            }
        }
        self.slots.clear();
        self.captured = 0;
    }
}

#[cfg(test)]
mod tests {
    use kiln_kernels::cuda::emulator::Emulator;
    use kiln_kernels::cuda::{Device, KernelArg, LaunchConfig};

    use super::*;

    /// The classic CUDA-graph bug, caught: a step whose launch argument is a
    /// value that changes between runs (instead of device memory updated in
    /// place) would replay the value captured.
    #[test]
    fn a_replay_whose_launch_arguments_changed_is_refused() {
        let dir = std::env::temp_dir().join(format!("kiln-graphs-{}", std::process::id()));
        let device = Emulator::new(1 << 20, dir);
        let source =
            r#"extern "C" __global__ void kiln_fill(float* y, float v) { y[threadIdx.x] = v; }"#;
        let fill = device.load("fill.cu", source, &["kiln_fill"]).unwrap()[0];
        let y = device.alloc(4 * 32).unwrap();
        let mut cache = GraphCache::default();
        let key: GraphKey = (vec![("T".into(), 1)], [0; 4]);
        let mut step = |value: f32| {
            cache.run(&device, key.clone(), || {
                device
                    .launch(
                        fill,
                        LaunchConfig::linear(1, 32),
                        &[KernelArg::Ptr(y), KernelArg::F32(value)],
                    )
                    .map_err(|e| e.to_string())
            })
        };
        step(1.0).unwrap(); // eager
        step(1.0).unwrap(); // captured
        step(1.0).unwrap(); // replayed: the same work
        let err = step(2.0).unwrap_err();
        assert!(
            err.contains("stale work") && err.contains("kiln_fill"),
            "{err}"
        );
        let mut out = [0u8; 4];
        device.download(y, &mut out).unwrap();
        assert_eq!(f32::from_le_bytes(out), 1.0, "the stale replay did not run");
    }
}
