//! Mixtures of experts on the device (`kernels/cuda/moe.cu`): the experts'
//! matrices are uploaded at load with a table of their addresses; a step
//! routes every token on the device, then runs only its picked experts, so
//! it never waits for the host and replays in a captured graph.
//!
//! Expert matrices are stored as GGUF blocks, read packed (Q8_0, Q4_0,
//! Q4_K, Q6_K, as the decode products keep them), or as dense rows (bf16,
//! f16 as stored, f32 with `--dtype float32`). The gate and up matrices
//! share one storage; the down matrices may have another (a Q4_K_M file
//! keeps some `ffn_down_exps` in Q6_K).

use kiln_kernels::cuda::{Device, DevicePtr, GemmType, KernelArg, LaunchConfig};
use kiln_kernels::quant::QuantType;
use kiln_plugin_api::graph::{MoeRouting, MoeSpec};

use super::fusion::GatedActivation;
use super::launch::Frame;
use super::weights::{self, Packed, WeightDtype};
use crate::runtime::WeightData;

/// Warps per block of the expert kernels, one output row each (`KILN_MOE_WARPS`).
const WARPS: usize = 4;
/// Most experts the router takes (`KILN_MOE_MAX_EXPERTS`).
const MAX_EXPERTS: u32 = 512;
/// Most expert groups (`KILN_MOE_MAX_GROUPS`).
const MAX_GROUPS: u32 = 64;

/// A mixture's device side.
#[derive(Clone, Debug)]
pub struct MoePlan {
    /// Routing and activation.
    pub spec: MoeSpec,
    /// The gate/up and down kernels for the experts' storage.
    kernels: [&'static str; 2],
    /// The experts' activation (of gate, times up).
    activation: GatedActivation,
    /// Addresses of the gate, up and down tables (`E` addresses each).
    tables: [DevicePtr; 3],
    /// Width of an expert.
    inter: usize,
    /// Bytes and elements of the matrices one token's picks read.
    pub per_token: (usize, usize),
}

/// Uploads the experts' matrices (`gate`, `up`, `down`: graph weight
/// indices per expert) and their address tables; `owned` collects the
/// allocations.
pub fn plan(
    device: &dyn Device,
    spec: &MoeSpec,
    experts: [&[usize]; 3],
    weights: &[WeightData],
    dtype: WeightDtype,
    owned: &mut Vec<u64>,
) -> Result<MoePlan, String> {
    if spec.num_experts > MAX_EXPERTS {
        return Err(format!(
            "{} experts exceed the {MAX_EXPERTS} the router takes",
            spec.num_experts
        ));
    }
    if let MoeRouting::Sigmoid { groups, .. } = spec.routing {
        if groups > MAX_GROUPS {
            return Err(format!("{groups} expert groups exceed {MAX_GROUPS}"));
        }
    }
    let activation = GatedActivation::of(spec.activation).ok_or_else(|| {
        format!(
            "the expert activation {:?} has no CUDA kernel",
            spec.activation
        )
    })?;
    let gate_up = Storage::of(&weights[experts[0][0]], dtype);
    let down = Storage::of(&weights[experts[2][0]], dtype);
    let kernels = [gate_up.kernels()[0], down.kernels()[1]];
    let inter = weights[experts[0][0]].spec.shape[0] as usize;
    let mut tables = [0; 3];
    let (mut bytes, mut elements) = (0, 0);
    for ((table, indices), storage) in tables.iter_mut().zip(experts).zip([gate_up, gate_up, down])
    {
        let mut addresses = Vec::with_capacity(indices.len() * 8);
        for &index in indices {
            let weight = &weights[index];
            if Storage::of(weight, dtype) != storage {
                return Err(format!(
                    "expert `{}` is {}, other experts {storage:?}: the gate and up matrices \
                     share one storage, the down matrices one",
                    weight.spec.name, weight.spec.encoding
                ));
            }
            let (ty, packed) = match storage {
                Storage::Packed(p) => (weights::product_type(weight, dtype), Some(p)),
                Storage::Dense(ty) => (ty, None),
            };
            let m =
                weights::upload_matrix(device, weight, ty, packed).map_err(|e| e.to_string())?;
            owned.push(m.ptr);
            (bytes, elements) = (bytes + m.bytes(), elements + m.rows * m.cols);
            addresses.extend_from_slice(&m.ptr.to_le_bytes());
        }
        let ptr = device.alloc(addresses.len()).map_err(|e| e.to_string())?;
        device.upload(ptr, &addresses).map_err(|e| e.to_string())?;
        owned.push(ptr);
        *table = ptr;
    }
    let share = |n: usize| n * spec.top_k as usize / spec.num_experts as usize;
    Ok(MoePlan {
        spec: spec.clone(),
        kernels,
        activation,
        tables,
        inter,
        per_token: (share(bytes), share(elements)),
    })
}

/// How a table's expert matrices are stored on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Storage {
    /// GGUF blocks, read packed.
    Packed(QuantType),
    /// Rows of one element type.
    Dense(GemmType),
}

impl Storage {
    /// The storage of `weight` under `--dtype`: its blocks where a packed
    /// format reads them, else rows of its product type.
    fn of(weight: &WeightData, dtype: WeightDtype) -> Self {
        match weights::packed_format(weight, dtype) {
            Some(packed) => Self::Packed(packed),
            None => Self::Dense(weights::product_type(weight, dtype)),
        }
    }

    /// Its gate/up and down kernels.
    fn kernels(self) -> [&'static str; 2] {
        match self {
            Self::Packed(packed) => packed.kernels().moe,
            Self::Dense(GemmType::F32) => ["kiln_moe_gate_up_f32", "kiln_moe_down_f32"],
            Self::Dense(GemmType::BF16) => ["kiln_moe_gate_up_bf16", "kiln_moe_down_bf16"],
            Self::Dense(GemmType::F16) => ["kiln_moe_gate_up_f16", "kiln_moe_down_f16"],
        }
    }
}

/// Byte offsets in a step's scratch of the picks, their weights and the
/// experts' hidden rows, for `tokens` tokens; and the total.
fn layout(plan: &MoePlan, tokens: usize) -> ([usize; 3], usize) {
    let align = |n: usize| n.div_ceil(super::memory::ALIGN) * super::memory::ALIGN;
    let slots = tokens * plan.spec.top_k as usize;
    let weights = align(slots * 4);
    let hidden = weights + align(slots * 4);
    ([0, weights, hidden], hidden + slots * plan.inter * 4)
}

/// Scratch bytes of a mixture over `x_elements` values of x `[T, hidden]`.
pub fn scratch_bytes(plan: &MoePlan, x_elements: usize, hidden: usize) -> usize {
    layout(plan, x_elements / hidden.max(1)).1
}

impl Frame<'_> {
    /// Routes `x [T, hidden]` by `logits [T, E]` (and `bias [E]`, 0 for
    /// none) and writes the mixture's output `out [T, hidden]`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mixture_of_experts(
        &self,
        plan: &MoePlan,
        x: DevicePtr,
        logits: DevicePtr,
        bias: DevicePtr,
        out: DevicePtr,
        tokens: usize,
        hidden: usize,
        scratch: Option<DevicePtr>,
    ) -> Result<(), String> {
        if tokens == 0 {
            return Ok(());
        }
        let scratch = scratch.ok_or("no scratch planned for the mixture of experts")?;
        let ([picks, weights, rows], _) = layout(plan, tokens);
        let (picks, weights, rows) = (
            scratch + picks as DevicePtr,
            scratch + weights as DevicePtr,
            scratch + rows as DevicePtr,
        );
        let spec = &plan.spec;
        let (scoring, groups, top_groups) = match spec.routing {
            MoeRouting::Softmax => (0, 1, 1),
            MoeRouting::Sigmoid {
                groups, top_groups, ..
            } => (1, groups, top_groups),
        };
        let int = |v: usize| KernelArg::I32(v as i32);
        let top_k = spec.top_k as usize;
        self.launch(
            "kiln_moe_route",
            LaunchConfig::linear(tokens as u32, 1),
            &[
                KernelArg::Ptr(logits),
                KernelArg::Ptr(bias),
                KernelArg::Ptr(picks),
                KernelArg::Ptr(weights),
                int(spec.num_experts as usize),
                int(top_k),
                int(scoring),
                int(groups as usize),
                int(top_groups as usize),
                int(usize::from(spec.renormalize)),
                KernelArg::F32(spec.scale),
            ],
        )?;
        // Rows of the experts on y (at most 65535 blocks), tokens and
        // picks on x (up to 2³¹ - 1).
        let grid = |rows: usize, x: usize| {
            LaunchConfig::new(
                (x as u32, rows.div_ceil(WARPS) as u32, 1),
                (32 * WARPS as u32, 1, 1),
            )
        };
        self.launch(
            plan.kernels[0],
            grid(plan.inter, tokens * top_k),
            &[
                KernelArg::Ptr(x),
                KernelArg::Ptr(picks),
                KernelArg::Ptr(plan.tables[0]),
                KernelArg::Ptr(plan.tables[1]),
                KernelArg::Ptr(rows),
                int(hidden),
                int(plan.inter),
                int(top_k),
                KernelArg::I32(plan.activation as i32),
            ],
        )?;
        self.launch(
            plan.kernels[1],
            grid(hidden, tokens),
            &[
                KernelArg::Ptr(rows),
                KernelArg::Ptr(picks),
                KernelArg::Ptr(weights),
                KernelArg::Ptr(plan.tables[2]),
                KernelArg::Ptr(out),
                int(hidden),
                int(plan.inter),
                int(top_k),
            ],
        )
    }
}
