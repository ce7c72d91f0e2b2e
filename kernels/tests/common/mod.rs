//! What the emulator tests share: an emulated device with kernels loaded by
//! name, typed uploads and downloads, seeded random data, and comparisons.
#![allow(dead_code)] // each test file uses its own subset

pub mod ragged;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use kiln_kernels::cuda::emulator::Emulator;
use kiln_kernels::cuda::sources::{self, Source};
use kiln_kernels::cuda::KernelArg::{self, I64};
use kiln_kernels::cuda::{
    float_pair_word, Device, DevicePtr, DeviceResult, FunctionId, LaunchConfig,
};
use kiln_kernels::quant::{dequantize_row, QuantType};

/// Largest |GPU - CPU| difference accepted for f32 kernels.
pub const TOL: f32 = 1e-5;

/// Blocks in x and y.
pub type Grid = (u32, u32);

/// An emulated device and the kernels loaded on it, by name.
pub struct Gpu {
    pub dev: Emulator,
    pub kernels: HashMap<String, FunctionId>,
}

impl Gpu {
    pub fn new(modules: &[Source]) -> Self {
        let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("emulator");
        let (dev, kernels) = (Emulator::new(256 << 20, cache), HashMap::new());
        let mut gpu = Gpu { dev, kernels };
        modules.iter().for_each(|m| gpu.load(m.name, m.text));
        gpu
    }

    /// Loads are serialized: the emulator's compile cache names its temporary
    /// file by process id only, so two test threads compiling the same source
    /// at once would write the same file.
    pub fn load(&mut self, name: &str, text: &str) {
        static LOCK: Mutex<()> = Mutex::new(());
        let names = sources::kernel_names(text);
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let ids = self.dev.load(name, text, &refs);
        let ids = ids.unwrap_or_else(|e| panic!("{e}"));
        self.kernels.extend(names.into_iter().zip(ids));
    }

    pub fn f(&self, name: &str) -> FunctionId {
        self.kernels[name]
    }

    /// Launches `name` on `grid` blocks (x, y) of `block` threads.
    pub fn try_run(&self, f: &str, grid: Grid, block: u32, args: &[KernelArg]) -> DeviceResult<()> {
        let mut config = LaunchConfig::linear(grid.0, block);
        config.grid.1 = grid.1;
        self.dev.launch(self.f(f), config, args)
    }

    pub fn run(&self, name: &str, grid: Grid, block: u32, args: &[KernelArg]) {
        let done = self.try_run(name, grid, block, args);
        done.unwrap_or_else(|e| panic!("{e}"));
    }

    /// A new allocation holding `data`.
    pub fn up<T: Elem>(&self, data: &[T]) -> DevicePtr {
        let ptr = self.dev.alloc(data.len() * T::SIZE).expect("alloc");
        self.dev.upload(ptr, &bytes(data)).expect("upload");
        ptr
    }

    pub fn zeros(&self, bytes: usize) -> DevicePtr {
        self.dev.alloc(bytes).expect("alloc")
    }

    pub fn down<T: Elem>(&self, ptr: DevicePtr, len: usize) -> Vec<T> {
        let mut out = vec![0u8; len * T::SIZE];
        self.dev.download(ptr, &mut out).expect("download");
        out.chunks_exact(T::SIZE).map(T::get).collect()
    }

    /// Downloads `want.len()` floats at `ptr` and compares them with `want`.
    pub fn check(&self, ptr: DevicePtr, want: &[f32], what: &str) {
        close(&self.down(ptr, want.len()), want, TOL, what);
    }

    /// Runs `run(0)` (f32 results) and checks `out` against `want`, then
    /// [`Gpu::check_half_stores`] of that result.
    pub fn check_stores(&self, out: DevicePtr, want: &[f32], what: &str, run: impl Fn(usize)) {
        run(0);
        self.check(out, want, what);
        let exact: Vec<f32> = self.down(out, want.len());
        self.check_half_stores(out, &exact, what, run);
    }

    /// Checks a kernel whose last argument is `out_type` (as `store_as` in
    /// kiln_cuda.cuh numbers it), launched by `run(out_type)`: stored in
    /// bf16 (1) or f16 (2) at `out`, its result must be exactly the bits of
    /// `exact`, its f32 result (0), rounded to nearest even.
    pub fn check_half_stores(
        &self,
        out: DevicePtr,
        exact: &[f32],
        what: &str,
        run: impl Fn(usize),
    ) {
        for out_type in [1, 2] {
            run(out_type);
            let got: Vec<u16> = self.down(out, exact.len());
            let rounded: Vec<u16> = exact.iter().map(|&v| half_bits(out_type, v)).collect();
            assert_eq!(got, rounded, "{what}: stored as type {out_type}");
        }
    }
}

/// The bits of `v` rounded to bf16 (`out_type` 1) or f16 (2), as kernels
/// store an f32 result for products that read it in that type.
pub fn half_bits(out_type: usize, v: f32) -> u16 {
    match out_type {
        1 => half::bf16::from_f32(v).to_bits(),
        _ => half::f16::from_f32(v).to_bits(),
    }
}

/// `int` and `long long` arguments from sizes.
pub fn int(v: usize) -> KernelArg {
    KernelArg::I32(v as i32)
}

pub fn long(v: usize) -> KernelArg {
    I64(v as i64)
}

/// A `KilnRowNorm` (kiln_cuda.cuh) of `(weight, output, eps, offset,
/// out_type)`, or of none: the norm an embedding kernel takes with its
/// rows, which it leaves unscaled.
pub fn row_norm(norm: Option<(DevicePtr, DevicePtr, f32, f32, usize)>) -> KernelArg {
    scaled_row_norm(norm, 1.0)
}

/// [`row_norm`] with the rows scaled by `scale` first.
pub fn scaled_row_norm(
    norm: Option<(DevicePtr, DevicePtr, f32, f32, usize)>,
    scale: f32,
) -> KernelArg {
    let norm = norm.map(|(w, y, eps, offset, out_type)| (w, y, eps, offset, out_type as u32));
    kiln_kernels::cuda::row_norm_arg(norm, scale)
}

/// A `KilnHeadNorms` (rope.cu) of `(w, w2, eps, offset)`, or of none: the
/// per-head norms a rotary launch takes before it rotates.
pub fn head_norms(norms: Option<(DevicePtr, DevicePtr, f32, f32)>) -> KernelArg {
    KernelArg::Struct(match norms {
        Some((w, w2, eps, offset)) => vec![w, w2, float_pair_word(eps, offset)],
        None => vec![0; 3],
    })
}

/// Plain values moved to and from device memory.
pub trait Elem: Copy {
    const SIZE: usize;
    fn put(self, out: &mut Vec<u8>);
    fn get(bytes: &[u8]) -> Self;
}

macro_rules! elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes.try_into().expect("element size"))
            }
        }
    )*};
}
elem!(f32, i64, i32, u32, u16, u8);

pub fn bytes<T: Elem>(data: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() * T::SIZE);
    data.iter().for_each(|v| v.put(&mut out));
    out
}

/// Deterministic pseudo-random numbers (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn u32(&mut self) -> u32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
    }

    /// `len` values in [-amplitude, amplitude).
    pub fn data(&mut self, len: usize, amplitude: f32) -> Vec<f32> {
        // 24 random bits over 2^23: uniform in [0, 2).
        let unit = |r: u32| (r >> 8) as f32 / (1u32 << 23) as f32;
        let mut next = || unit(self.u32()) * amplitude - amplitude;
        (0..len).map(|_| next()).collect()
    }
}

/// Asserts `max |got - want| <= tolerance` (a NaN on either side fails).
pub fn close(got: &[f32], want: &[f32], tolerance: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let (mut at, mut worst) = (0, 0f32);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let d = (g - w).abs();
        let d = if d.is_nan() { f32::INFINITY } else { d };
        (at, worst) = if d > worst { (i, d) } else { (at, worst) };
    }
    let (ok, g, w) = (worst <= tolerance, got[at], want[at]);
    assert!(ok, "{what}: |Δ| {worst:.2e} at {at} (got {g}, want {w})");
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Random blocks of `ty` for `rows × cols` values, with every f16 scale set
/// to a small finite value; and their values decoded by the CPU.
pub fn random_blocks(ty: QuantType, rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let mut rng = Rng::new(seed);
    let row_bytes = ty.row_bytes(cols).unwrap();
    let mut packed: Vec<u8> = (0..rows * row_bytes).map(|_| rng.u32() as u8).collect();
    for (i, block) in packed.chunks_exact_mut(ty.block_bytes()).enumerate() {
        for &at in ty.f16_fields() {
            let scale = half::f16::from_f32(0.01 + 0.001 * (i % 7) as f32);
            block[at..at + 2].copy_from_slice(&scale.to_le_bytes());
        }
    }
    let mut values = vec![0f32; rows * cols];
    for (row, out) in packed
        .chunks_exact(row_bytes)
        .zip(values.chunks_exact_mut(cols))
    {
        dequantize_row(ty, row, out).unwrap();
    }
    (packed, values)
}

/// `values` rounded to bf16 by the half crate: the bits and their values.
pub fn bf16s(values: &[f32]) -> (Vec<u16>, Vec<f32>) {
    use half::bf16;
    let bits: Vec<u16> = values
        .iter()
        .map(|&v| bf16::from_f32(v).to_bits())
        .collect();
    let rounded = bits.iter().map(|&b| bf16::from_bits(b).to_f32()).collect();
    (bits, rounded)
}

/// `values` encoded as E4M3 (the fp8 KV cache's `fp8_e4m3`) by the
/// reference, the float8 crate (a port of cuda_fp8.hpp's conversions): the
/// bytes and their values.
pub fn e4m3(values: &[f32]) -> (Vec<u8>, Vec<f32>) {
    use float8::F8E4M3;
    let bytes: Vec<u8> = values
        .iter()
        .map(|&v| F8E4M3::from_f32(v).to_bits())
        .collect();
    let decoded = bytes
        .iter()
        .map(|&b| F8E4M3::from_bits(b).to_f32())
        .collect();
    (bytes, decoded)
}

/// `values` as the dense GEMV kernels read them, with the values those
/// bytes hold: (kernel name without suffixes, stored bytes, decoded) for
/// bf16, f16 and f32 rows.
pub fn dense_formats(values: &[f32]) -> [(&'static str, Vec<u8>, Vec<f32>); 3] {
    use half::f16;
    let (as_bf16, from_bf16) = bf16s(values);
    let as_f16: Vec<u16> = values.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
    let from_f16 = as_f16.iter().map(|&b| f16::from_bits(b).to_f32()).collect();
    [
        ("kiln_gemv_bf16", bytes(&as_bf16), from_bf16),
        ("kiln_gemv_f16", bytes(&as_f16), from_f16),
        ("kiln_gemv_f32", bytes(values), values.to_vec()),
    ]
}

/// The words of a `KilnGemvGroup` (gemv.cuh) without a rotation or greedy's
/// pick: matrices (device pointer, rows), their outputs and the gated
/// activation (0: none).
pub fn gemv_group(
    matrices: &[(DevicePtr, usize)],
    outputs: &[DevicePtr],
    activation: u64,
) -> KernelArg {
    let pad = |mut v: Vec<u64>| {
        v.resize(4, 0);
        v
    };
    let mut end = 0;
    let ends = matrices.iter().map(|&(_, rows)| {
        end += rows as u64;
        end
    });
    let mut words = vec![matrices.len() as u64];
    words.extend(pad(ends.collect()));
    words.extend(pad(matrices.iter().map(|&(w, _)| w).collect()));
    words.extend(pad(outputs.to_vec()));
    words.push(activation);
    words.extend([0; 13]); // no rotation (`KilnGemvRope`)
    words.extend([0; 3]); // no greedy pick (`KilnGemvArgmax`)
    words.extend([0; 8]); // no norm folded in (`KilnGemvNorm`, `row_scales`)
    KernelArg::Struct(words)
}

/// `y[i, r] = Σ_j x[i, j] W[r, j]` in f64, for `W [n, k]` and `x [m, k]`.
pub fn reference_product(w: &[f32], x: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut y = vec![0f32; m * n];
    for i in 0..m {
        for r in 0..n {
            let dot: f64 = (0..k)
                .map(|j| f64::from(x[i * k + j]) * f64::from(w[r * k + j]))
                .sum();
            y[i * n + r] = dot as f32;
        }
    }
    y
}
