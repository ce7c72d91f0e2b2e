//! The paged KV cache storage: per layer, keys and values of
//! `[num_blocks, block_size, num_kv_heads, head_dim]`, in host memory for
//! the CPU backend (f32, f16, bf16 or Q8_0 blocks) or in device memory for
//! the CUDA backend. Which blocks a sequence owns is the scheduler's
//! business; this only holds the memory.

use half::{bf16, f16};
use kiln_kernels::dense::attention::{CacheElement, CacheLayout};
use kiln_kernels::quant::{BlockQ8_0, Precision};
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
    Host(HostLayers),
    Device(DeviceKvCache),
}

/// Keys and values of every layer in host memory, of one element type.
#[derive(Debug)]
enum HostLayers {
    F32(Vec<(Vec<f32>, Vec<f32>)>),
    F16(Vec<(Vec<f16>, Vec<f16>)>),
    Bf16(Vec<(Vec<bf16>, Vec<bf16>)>),
    Q8_0(Vec<(Vec<BlockQ8_0>, Vec<BlockQ8_0>)>),
}

/// The KV cache's element type as asked for (`--kv-cache-dtype`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvCacheDtype {
    /// On a GPU bf16, or f32 with `--dtype float32`; on the CPU f16 in fast
    /// precision (llama.cpp's default) and f32 in exact precision, which
    /// promises transformers' fp32 logits within 1e-4.
    #[default]
    Auto,
    /// f32.
    Float32,
    /// bf16: half the memory and half the bytes attention reads.
    BFloat16,
    /// f16 (the CPU backend only).
    Float16,
    /// Q8_0 blocks, 34 bytes per 32 numbers (the CPU backend only; head
    /// sizes that are multiples of 32).
    Q8_0,
    /// 8-bit floats, E4M3 (vLLM's `fp8` with its default scale of 1: values
    /// round to 3 bits of mantissa and saturate at ±448): a quarter of f32's
    /// memory and bytes read (the CUDA backend only).
    Fp8E4m3,
}

impl KvCacheDtype {
    /// Its `--kv-cache-dtype` name.
    pub fn name(self) -> &'static str {
        match self {
            KvCacheDtype::Auto => "auto",
            KvCacheDtype::Float32 => "float32",
            KvCacheDtype::BFloat16 => "bfloat16",
            KvCacheDtype::Float16 => "float16",
            KvCacheDtype::Q8_0 => "q8_0",
            KvCacheDtype::Fp8E4m3 => "fp8",
        }
    }

    /// Why the backend (`cuda`, else the CPU's) cannot store it, if it
    /// cannot: a GPU cache holds f32, bf16 or fp8, the CPU's f32, f16, bf16
    /// or Q8_0.
    pub fn unsupported_on(self, cuda: bool) -> Option<String> {
        let refused = match self {
            KvCacheDtype::Float16 | KvCacheDtype::Q8_0 => cuda,
            KvCacheDtype::Fp8E4m3 => !cuda,
            _ => false,
        };
        let (backend, holds) = if cuda {
            (
                "CPU backend",
                "the cache on a GPU holds bfloat16, float32 or fp8",
            )
        } else {
            (
                "CUDA backend",
                "the CPU's cache holds float32, float16, bfloat16 or q8_0",
            )
        };
        refused.then(|| {
            format!(
                "--kv-cache-dtype {} is for the {backend}: {holds}",
                self.name()
            )
        })
    }

    /// What the CPU backend's cache stores in `precision`; fails for the
    /// types only a GPU stores.
    pub fn on_host(self, precision: Precision) -> Result<HostKvDtype, String> {
        Ok(match (self, precision) {
            (KvCacheDtype::Auto, Precision::Fast | Precision::FastResidual)
            | (KvCacheDtype::Float16, _) => HostKvDtype::F16,
            (KvCacheDtype::Auto, Precision::Exact) | (KvCacheDtype::Float32, _) => HostKvDtype::F32,
            (KvCacheDtype::BFloat16, _) => HostKvDtype::Bf16,
            (KvCacheDtype::Q8_0, _) => HostKvDtype::Q8_0,
            (KvCacheDtype::Fp8E4m3, _) => {
                return Err(self.unsupported_on(false).unwrap_or_default())
            }
        })
    }
}

/// The element type of a KV cache in host memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostKvDtype {
    /// f32: what attention computes in.
    F32,
    /// f16 (llama.cpp's default): half the memory.
    F16,
    /// bf16: half the memory, f32's range.
    Bf16,
    /// Q8_0 blocks (llama.cpp's `q8_0`): 8.5 bits a number.
    Q8_0,
}

impl HostKvDtype {
    /// Bytes that `values` numbers (a multiple of 32 for Q8_0) take.
    pub fn bytes(self, values: usize) -> usize {
        match self {
            HostKvDtype::F32 => 4 * values,
            HostKvDtype::F16 | HostKvDtype::Bf16 => 2 * values,
            HostKvDtype::Q8_0 => values / BlockQ8_0::VALUES * size_of::<BlockQ8_0>(),
        }
    }

    /// Numbers one element of the cache holds: 32 for a Q8_0 block, else 1.
    pub fn values_per_element(self) -> usize {
        match self {
            HostKvDtype::Q8_0 => BlockQ8_0::VALUES,
            _ => 1,
        }
    }

    /// Checks that heads of `head_dim` numbers are whole elements (for
    /// Q8_0, whole blocks of 32).
    pub fn check_head_dim(self, head_dim: usize) -> Result<(), String> {
        let per_element = self.values_per_element();
        if head_dim.is_multiple_of(per_element) {
            Ok(())
        } else {
            Err(format!(
                "--kv-cache-dtype q8_0 stores heads in blocks of {per_element} numbers, and this model's heads have {head_dim}"
            ))
        }
    }
}

/// One layer's keys and values in host memory.
pub enum HostLayer<'a> {
    /// f32.
    F32(&'a mut [f32], &'a mut [f32]),
    /// f16.
    F16(&'a mut [f16], &'a mut [f16]),
    /// bf16.
    Bf16(&'a mut [bf16], &'a mut [bf16]),
    /// Q8_0 blocks.
    Q8_0(&'a mut [BlockQ8_0], &'a mut [BlockQ8_0]),
}

/// `num_layers` zeroed (keys, values) pairs of `len` elements, written
/// through at once (as llama.cpp clears its cache): the memory is taken at
/// start, where a shortage shows, and the process's size does not creep up
/// block by block while serving. Layers in parallel: the page faults of a
/// few GiB take seconds on one core.
fn zeroed_layers<T: CacheElement>(num_layers: usize, len: usize) -> Vec<(Vec<T>, Vec<T>)> {
    // `vec![0; len]` would be calloc's untouched pages.
    let zeroed = || {
        let mut v = Vec::with_capacity(len);
        v.resize(len, T::default());
        v
    };
    (0..num_layers)
        .into_par_iter()
        .map(|_| (zeroed(), zeroed()))
        .collect()
}

impl KvCache {
    /// Zeroed host storage of `dtype` for `num_layers` layers of
    /// `num_blocks` blocks. The head size must be a multiple of
    /// `dtype.values_per_element()` (which the CPU backend checks first).
    pub fn new(
        num_layers: usize,
        num_blocks: usize,
        layout: CacheLayout,
        dtype: HostKvDtype,
    ) -> Self {
        let len = num_blocks * layout.block_size * layout.position_stride();
        let layers = match dtype {
            HostKvDtype::F32 => HostLayers::F32(zeroed_layers(num_layers, len)),
            HostKvDtype::F16 => HostLayers::F16(zeroed_layers(num_layers, len)),
            HostKvDtype::Bf16 => HostLayers::Bf16(zeroed_layers(num_layers, len)),
            HostKvDtype::Q8_0 => {
                HostLayers::Q8_0(zeroed_layers(num_layers, len / BlockQ8_0::VALUES))
            }
        };
        Self {
            layout,
            num_blocks,
            num_layers,
            storage: Storage::Host(layers),
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
    pub fn layer_mut(&mut self, layer: usize) -> Option<HostLayer<'_>> {
        match &mut self.storage {
            Storage::Host(HostLayers::F32(layers)) => {
                let (k, v) = layers.get_mut(layer)?;
                Some(HostLayer::F32(k, v))
            }
            Storage::Host(HostLayers::F16(layers)) => {
                let (k, v) = layers.get_mut(layer)?;
                Some(HostLayer::F16(k, v))
            }
            Storage::Host(HostLayers::Bf16(layers)) => {
                let (k, v) = layers.get_mut(layer)?;
                Some(HostLayer::Bf16(k, v))
            }
            Storage::Host(HostLayers::Q8_0(layers)) => {
                let (k, v) = layers.get_mut(layer)?;
                Some(HostLayer::Q8_0(k, v))
            }
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
