//! CUDA graphs of whole steps. Once a binding of the symbolic sizes has a
//! plan, every launch of a step with that binding is the same (the same
//! kernels, the same arguments, the same addresses: inputs are uploaded into
//! the same arena slots before the launches), so the step can be captured
//! and replayed with one call instead of hundreds of launches. A binding is
//! captured the second time it runs (the first run is eager: compilation,
//! cuBLAS's own set-up) and replayed from then on; past [`MAX_GRAPHS`]
//! captured bindings, the cache starts over. `--enforce-eager` turns this
//! off.

use std::collections::HashMap;

use kiln_kernels::cuda::{Device, GraphId};

/// Bindings captured at most.
pub const MAX_GRAPHS: usize = 64;

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
    /// there is one, captures it on its second run, else launches eagerly.
    pub fn run(
        &mut self,
        device: &dyn Device,
        key: GraphKey,
        launch: impl FnOnce() -> Result<(), String>,
    ) -> Result<(), String> {
        match self.slots.get(&key).copied() {
            Some(Slot::Captured(graph)) => device.replay(graph).map_err(|e| e.to_string()),
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
