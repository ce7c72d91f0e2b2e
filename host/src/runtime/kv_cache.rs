//! The paged KV cache storage: per layer, keys and values of
//! `[num_blocks, block_size, num_kv_heads, head_dim]` f32. Which blocks a
//! sequence owns is the scheduler's business; this only holds the memory.

use kiln_kernels::dense::attention::CacheLayout;

/// Key/value storage for every layer.
#[derive(Debug)]
pub struct KvCache {
    layout: CacheLayout,
    num_blocks: usize,
    layers: Vec<(Vec<f32>, Vec<f32>)>,
}

impl KvCache {
    /// Zeroed storage for `num_layers` layers of `num_blocks` blocks.
    pub fn new(num_layers: usize, num_blocks: usize, layout: CacheLayout) -> Self {
        let len = num_blocks * layout.block_size * layout.position_stride();
        Self {
            layout,
            num_blocks,
            layers: (0..num_layers)
                .map(|_| (vec![0.0; len], vec![0.0; len]))
                .collect(),
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
        self.layers.len()
    }

    /// Keys and values of `layer`.
    pub fn layer_mut(&mut self, layer: usize) -> Option<(&mut [f32], &mut [f32])> {
        self.layers
            .get_mut(layer)
            .map(|(k, v)| (k.as_mut_slice(), v.as_mut_slice()))
    }
}
