//! The paged KV cache storage: per layer, keys and values of
//! `[num_blocks, block_size, num_kv_heads, head_dim]` f32, in host memory for
//! the CPU backend or in device memory for the CUDA backend. Which blocks a
//! sequence owns is the scheduler's business; this only holds the memory.

use kiln_kernels::dense::attention::CacheLayout;
use rayon::prelude::*;

use super::cuda::DeviceKvCache;

/// Key/value storage for every layer, made by a backend
/// ([`Backend::new_kv_cache`](super::Backend::new_kv_cache)).
#[derive(Debug)]
pub struct KvCache {
    layout: CacheLayout,
    num_blocks: usize,
    num_layers: usize,
    storage: Storage,
}

#[derive(Debug)]
enum Storage {
    Host(Vec<(Vec<f32>, Vec<f32>)>),
    Device(DeviceKvCache),
}

impl KvCache {
    /// Zeroed host storage for `num_layers` layers of `num_blocks` blocks,
    /// written through at once (as llama.cpp clears its cache): the memory
    /// is taken at start, where a shortage shows, and the process's size
    /// does not creep up block by block while serving.
    pub fn new(num_layers: usize, num_blocks: usize, layout: CacheLayout) -> Self {
        let len = num_blocks * layout.block_size * layout.position_stride();
        // `vec![0.0; len]` would be calloc's untouched pages.
        let zeroed = || {
            let mut v = Vec::with_capacity(len);
            v.resize(len, 0.0f32);
            v
        };
        Self {
            layout,
            num_blocks,
            num_layers,
            // Layers in parallel: the page faults of a few GiB take seconds
            // on one core.
            storage: Storage::Host(
                (0..num_layers)
                    .into_par_iter()
                    .map(|_| (zeroed(), zeroed()))
                    .collect(),
            ),
        }
    }

    /// Storage in device memory.
    pub(crate) fn on_device(
        num_layers: usize,
        num_blocks: usize,
        layout: CacheLayout,
        device: DeviceKvCache,
    ) -> Self {
        Self {
            layout,
            num_blocks,
            num_layers,
            storage: Storage::Device(device),
        }
    }

    /// The layout shared by every layer.
    pub fn layout(&self) -> CacheLayout {
        self.layout
    }

    /// Blocks per layer.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.num_layers
    }

    /// Keys and values of `layer` in host memory (`None` for a missing layer
    /// or device storage).
    pub fn layer_mut(&mut self, layer: usize) -> Option<(&mut [f32], &mut [f32])> {
        match &mut self.storage {
            Storage::Host(layers) => layers
                .get_mut(layer)
                .map(|(k, v)| (k.as_mut_slice(), v.as_mut_slice())),
            Storage::Device(_) => None,
        }
    }

    /// The device storage, if the cache lives on a device.
    pub(crate) fn device(&self) -> Option<&DeviceKvCache> {
        match &self.storage {
            Storage::Device(d) => Some(d),
            Storage::Host(_) => None,
        }
    }
}
