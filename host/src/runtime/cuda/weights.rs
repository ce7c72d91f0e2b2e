//! Weights and constants in device memory, uploaded once at load.
//!
//! A weight read by a matrix product or an embedding is stored for the GPU's
//! GEMM: bf16 and f16 as stored; f32 as bf16 unless `--dtype float32`. GGUF
//! matrices stay packed in every block format Kiln reads (Q8_0, Q4_0, Q4_1,
//! Q5_0, Q5_1, Q2_K to Q6_K, IQ4_NL, IQ4_XS: the decode GEMV and the
//! embedding read the blocks; larger batches expand them to bf16 in scratch
//! memory first), dequantized at load only with `--dtype float32` (to f32)
//! or `--dtype bfloat16`. Any other
//! weight (norm scales, biases, inverse frequencies) is stored as f32 values.

use half::{bf16, f16};
use kiln_kernels::cuda::{Device, DevicePtr, GemmType};
use kiln_kernels::quant::QuantType;
use kiln_plugin_api::Encoding;

use super::CudaError;
use crate::runtime::tensor::{Data, Tensor};
use crate::runtime::WeightData;

/// The element type of weights stored for products (`--dtype`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightDtype {
    /// bf16 and f16 as stored, everything else as bf16.
    #[default]
    Auto,
    /// Everything as f32 (exact against the CPU backend).
    Float32,
    /// Everything as bf16.
    BFloat16,
}

/// A matrix in device memory.
#[derive(Clone, Copy, Debug)]
pub struct DeviceMatrix {
    /// Where.
    pub ptr: DevicePtr,
    /// Element type (of the GEMM's operands, for a packed matrix).
    pub ty: GemmType,
    /// The GGUF blocks it is stored in, if packed.
    pub packed: Option<QuantType>,
    /// Rows (the first axis).
    pub rows: usize,
    /// Columns (the last axis).
    pub cols: usize,
    /// Products over it with up to `GEMV_MAX_M` rows of x quantize x to
    /// 8 bits and take integer dot products (`--precision fast`; packed
    /// matrices only).
    pub int8_activations: bool,
    /// Products over it (dense bf16) with 3 to 64 rows of x run on the
    /// tensor-core kernel of packed blocks rather than cuBLAS
    /// (`qmm::DenseRows`).
    pub dense_on_tensor_cores: bool,
    /// Most rows of x the decode GEMV takes for it when dense
    /// (`gemv::DenseGemvRows`; a packed matrix's GEMV takes `GEMV_MAX_M`).
    pub dense_gemv_rows: usize,
}

impl DeviceMatrix {
    /// A matrix of `(rows, cols)` at `ptr`, with the load options' defaults
    /// (the lowering sets them per product).
    pub fn placed(
        ptr: DevicePtr,
        ty: GemmType,
        packed: Option<QuantType>,
        (rows, cols): (usize, usize),
    ) -> Self {
        Self {
            ptr,
            ty,
            packed,
            rows,
            cols,
            int8_activations: false,
            dense_on_tensor_cores: false,
            dense_gemv_rows: super::gemv::DENSE_GEMV_MAX_M,
        }
    }
}

#[cfg(test)]
impl DeviceMatrix {
    /// A bf16 matrix, or one `packed`, at address 0: for tests of launch
    /// shapes and routes.
    pub fn unplaced(packed: Option<QuantType>, rows: usize, cols: usize) -> Self {
        Self::placed(0, GemmType::BF16, packed, (rows, cols))
    }
}

impl DeviceMatrix {
    /// Bytes it takes on the device.
    pub fn bytes(&self) -> usize {
        match self.packed {
            Some(p) => p.row_bytes(self.cols).unwrap_or(0) * self.rows,
            None => self.rows * self.cols * self.ty.size(),
        }
    }
}

/// The kernels that read one packed format.
pub struct PackedKernels {
    /// The decode GEMV (up to `GEMV_MAX_M` rows of x).
    pub gemv: &'static str,
    /// The decode GEMV for one row of x.
    pub gemv_m1: &'static str,
    /// The decode GEMVs on x quantized to 8 bits, for several rows and one.
    pub gemv_x8: [&'static str; 2],
    /// The tensor-core product for batches past the GEMV's (`qmatmul.cu`):
    /// up to 64 rows of x, and (`_m16`) up to 16.
    pub qmm: [&'static str; 2],
    /// The expansion to bf16.
    pub dequant: &'static str,
    /// Embedding rows.
    pub embedding: &'static str,
    /// The experts' gate and up products, and their down product (`moe.cu`).
    pub moe: [&'static str; 2],
}

/// A GGUF block format kept packed on the device: the kernels of
/// `gemv.cuh`, `qmatmul.cu` and `moe.cu` that read it (every format Kiln
/// reads has them).
pub trait Packed: Sized {
    /// Threads a block is split among (`LANES` in `gguf_blocks.cuh`): the
    /// expansion to bf16 takes a thread per lane part.
    fn lanes(self) -> usize;
    /// Its kernels: every name is the kind's prefix and the format's
    /// suffix (`kiln_gemv_q4_k`, `kiln_qmm_q4_k_m16`, …).
    fn kernels(self) -> PackedKernels;
    /// The decode GEMVs of a group whose matrices are in this format but
    /// the last, which is in `last` (`gemv_blocks`' LAST in gemv.cuh: the
    /// K-quants with the v that llama.cpp's files keep at more bits, Q6_K
    /// in Q4_K_M and Q5_K_M, Q4_K or Q5_K in Q3_K_M, Q3_K or Q4_K in Q2_K):
    /// for several rows of x and one, then on 8-bit x likewise.
    fn mixed_gemv(self, last: Self) -> Option<[&'static str; 4]>;
}

impl Packed for QuantType {
    fn lanes(self) -> usize {
        match self {
            Self::Q8_0 | Self::Q4_0 | Self::Q5_0 | Self::Q4_1 | Self::Q5_1 | Self::IQ4NL => 4,
            Self::Q2K | Self::Q3K | Self::Q4K | Self::Q5K | Self::IQ4XS => 8,
            Self::Q6K => 32,
        }
    }

    fn kernels(self) -> PackedKernels {
        macro_rules! kernels_of {
            ($f:literal) => {
                PackedKernels {
                    gemv: concat!("kiln_gemv_", $f),
                    gemv_m1: concat!("kiln_gemv_", $f, "_m1"),
                    gemv_x8: [
                        concat!("kiln_gemv_", $f, "_x8"),
                        concat!("kiln_gemv_", $f, "_x8_m1"),
                    ],
                    qmm: [concat!("kiln_qmm_", $f), concat!("kiln_qmm_", $f, "_m16")],
                    dequant: concat!("kiln_dequant_", $f),
                    embedding: concat!("kiln_embedding_", $f),
                    moe: [
                        concat!("kiln_moe_gate_up_", $f),
                        concat!("kiln_moe_down_", $f),
                    ],
                }
            };
        }
        match self {
            Self::Q8_0 => kernels_of!("q8_0"),
            Self::Q4_0 => kernels_of!("q4_0"),
            Self::Q5_0 => kernels_of!("q5_0"),
            Self::Q4_1 => kernels_of!("q4_1"),
            Self::Q5_1 => kernels_of!("q5_1"),
            Self::Q2K => kernels_of!("q2_k"),
            Self::Q3K => kernels_of!("q3_k"),
            Self::Q4K => kernels_of!("q4_k"),
            Self::Q5K => kernels_of!("q5_k"),
            Self::Q6K => kernels_of!("q6_k"),
            Self::IQ4NL => kernels_of!("iq4_nl"),
            Self::IQ4XS => kernels_of!("iq4_xs"),
        }
    }

    fn mixed_gemv(self, last: Self) -> Option<[&'static str; 4]> {
        macro_rules! mixed {
            ($f:literal) => {
                [
                    concat!("kiln_gemv_", $f),
                    concat!("kiln_gemv_", $f, "_m1"),
                    concat!("kiln_gemv_", $f, "_x8"),
                    concat!("kiln_gemv_", $f, "_x8_m1"),
                ]
            };
        }
        Some(match (self, last) {
            (Self::Q4K, Self::Q6K) => mixed!("q4_k_q6_k"),
            (Self::Q5K, Self::Q6K) => mixed!("q5_k_q6_k"),
            (Self::Q3K, Self::Q4K) => mixed!("q3_k_q4_k"),
            (Self::Q3K, Self::Q5K) => mixed!("q3_k_q5_k"),
            (Self::Q2K, Self::Q3K) => mixed!("q2_k_q3_k"),
            (Self::Q2K, Self::Q4K) => mixed!("q2_k_q4_k"),
            _ => return None,
        })
    }
}

/// The block format `weight` keeps on the device, where `dtype` allows.
pub fn packed_format(weight: &WeightData, dtype: WeightDtype) -> Option<QuantType> {
    weight.quant_type().filter(|_| dtype == WeightDtype::Auto)
}

/// The kernel that reads embedding rows of `table`.
pub fn embedding_kernel(table: &DeviceMatrix) -> &'static str {
    match (table.packed, table.ty) {
        (Some(p), _) => p.kernels().embedding,
        (None, GemmType::F32) => "kiln_embedding_f32",
        (None, GemmType::BF16) => "kiln_embedding_bf16",
        (None, GemmType::F16) => "kiln_embedding_f16",
    }
}

/// The element type `weight` gets on the device for products.
pub fn product_type(weight: &WeightData, dtype: WeightDtype) -> GemmType {
    match (dtype, weight.spec.encoding) {
        (WeightDtype::Float32, _) => GemmType::F32,
        (WeightDtype::Auto, Encoding::Float16) => GemmType::F16,
        _ => GemmType::BF16,
    }
}

/// Uploads `weight` as a matrix of `ty` (rows = first axis), or as its
/// blocks when `packed`.
pub fn upload_matrix(
    device: &dyn Device,
    weight: &WeightData,
    ty: GemmType,
    packed: Option<QuantType>,
) -> Result<DeviceMatrix, CudaError> {
    let ptr = upload(
        device,
        &matrix_bytes(weight, ty, packed)?,
        &weight.spec.name,
    )?;
    Ok(DeviceMatrix::placed(ptr, ty, packed, matrix_dims(weight)))
}

/// Uploads `members` (dense matrices of one row length) as `ty` one after
/// another in one allocation, a stacked matrix whose rows are theirs in
/// order (`stacked.rs`): the allocation, and each member's matrix in it.
pub fn upload_stacked(
    device: &dyn Device,
    members: &[&WeightData],
    ty: GemmType,
) -> Result<(DevicePtr, Vec<DeviceMatrix>), CudaError> {
    let sizes: Vec<usize> = members.iter().map(|w| w.elements() * ty.size()).collect();
    let total = sizes.iter().sum();
    let names: Vec<&str> = members.iter().map(|w| w.spec.name.as_str()).collect();
    let what = names.join(" + ");
    let base = device
        .alloc(total)
        .map_err(|e| CudaError::Memory(format!("`{what}` ({total} bytes): {e}")))?;
    let mut matrices = Vec::with_capacity(members.len());
    let mut at = base;
    for (weight, size) in members.iter().zip(sizes) {
        let placed = matrix_bytes(weight, ty, None).and_then(|bytes| {
            device
                .upload(at, &bytes)
                .map_err(|e| CudaError::Device(format!("uploading `{}`: {e}", weight.spec.name)))
        });
        if let Err(e) = placed {
            device.free(base);
            return Err(e);
        }
        matrices.push(DeviceMatrix::placed(at, ty, None, matrix_dims(weight)));
        at += size as DevicePtr;
    }
    Ok((base, matrices))
}

/// A matrix weight's `(rows, cols)`: its last axis, and all the others.
fn matrix_dims(weight: &WeightData) -> (usize, usize) {
    let cols = *weight.spec.shape.last().unwrap_or(&1) as usize;
    (weight.elements() / cols.max(1), cols)
}

/// `weight`'s bytes as a matrix of `ty`, or its blocks when `packed`.
fn matrix_bytes(
    weight: &WeightData,
    ty: GemmType,
    packed: Option<QuantType>,
) -> Result<Vec<u8>, CudaError> {
    Ok(match (ty, weight.spec.encoding) {
        _ if packed.is_some() => weight.bytes().to_vec(),
        (GemmType::BF16, Encoding::BFloat16) | (GemmType::F16, Encoding::Float16) => {
            weight.bytes().to_vec()
        }
        (GemmType::F32, Encoding::Float32) => weight.bytes().to_vec(),
        _ => {
            let mut values = vec![0f32; weight.elements()];
            let rows = matrix_dims(weight).0;
            weight
                .decode_rows(0..rows, &mut values)
                .map_err(|e| CudaError::Weight(weight.spec.name.clone(), e))?;
            encode(&values, ty)
        }
    })
}

/// Uploads `weight` decoded to f32 values.
pub fn upload_values(device: &dyn Device, weight: &WeightData) -> Result<DevicePtr, CudaError> {
    let cols = *weight.spec.shape.last().unwrap_or(&1) as usize;
    let rows = weight.elements() / cols.max(1);
    let mut values = vec![0f32; weight.elements()];
    weight
        .decode_rows(0..rows, &mut values)
        .map_err(|e| CudaError::Weight(weight.spec.name.clone(), e))?;
    upload(device, &encode(&values, GemmType::F32), &weight.spec.name)
}

/// Uploads a host tensor in the device's storage (f32, i64, or one byte
/// per bool).
pub fn upload_tensor(
    device: &dyn Device,
    tensor: &Tensor,
    what: &str,
) -> Result<DevicePtr, CudaError> {
    upload(device, &tensor_bytes(tensor), what)
}

/// A tensor's bytes in the device's storage.
pub fn tensor_bytes(tensor: &Tensor) -> Vec<u8> {
    match &tensor.data {
        Data::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::Bool(v) => v.iter().map(|&b| u8::from(b)).collect(),
    }
}

fn encode(values: &[f32], ty: GemmType) -> Vec<u8> {
    match ty {
        GemmType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GemmType::BF16 => values
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
        GemmType::F16 => values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
    }
}

fn upload(device: &dyn Device, bytes: &[u8], what: &str) -> Result<DevicePtr, CudaError> {
    let ptr = device
        .alloc(bytes.len())
        .map_err(|e| CudaError::Memory(format!("`{what}` ({} bytes): {e}", bytes.len())))?;
    device
        .upload(ptr, bytes)
        .map_err(|e| CudaError::Device(format!("uploading `{what}`: {e}")))?;
    Ok(ptr)
}
