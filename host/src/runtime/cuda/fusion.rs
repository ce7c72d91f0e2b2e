//! Fusions the CUDA backend adds to a lowered program, beyond the
//! compiler's own element-wise chains: products that share their input run
//! as one launch (q, k and v; gate and up), a gated MLP's activation inside
//! its gate and up GEMV, a residual add with the RMS norm that reads it
//! (and the first and last layers' norms with the launches beside them:
//! `end_norms.rs`; a post-norm with the add and norm after it:
//! `post_norms.rs`; q's and k's per-head norms with their rotation:
//! `head_norms.rs`),
//! the rotations of q and k in one launch that also writes the KV cache,
//! norms, activations and attention that store their result in the half
//! type of the products that read it, and products that store theirs in a
//! half type for the generated kernels that read it. Each pass rewrites
//! [`StepPlan`]s in place; a step computed by an earlier launch becomes
//! [`StepPlan::ComputedAt`].

use std::collections::HashMap;

use kiln_kernels::cuda::GemmType;
use kiln_plugin_api::graph::{BinaryOp, DType, Op, UnaryOp, ValueId};

use super::gemv::{GemvGroup, GEMV_MAX_GROUP};
use super::plan::{CacheWrite, GroupRotation, Home, RotatingGroup, RowNorm, StepPlan};
use super::stacked::Stack;
use super::weights::DeviceMatrix;
use crate::compiler::{ElementOp, Instr, Kernel, Operand, Program};

/// Runs every pass over `steps`, lowered from `program` (`homes`: where
/// each value lives); returns the values written in a half type.
pub fn fuse(program: &Program, homes: &[Home], steps: &mut [StepPlan]) -> HalfValues {
    group_products(program, steps);
    fuse_gated_activations(program, steps);
    fuse_add_rms_norm(program, homes, steps);
    super::end_norms::fuse_end_norms(program, homes, steps);
    super::post_norms::fuse_post_norms(program, homes, steps);
    pair_rotations(program, steps);
    write_cache_with_rotations(program, steps);
    super::head_norms::fuse_head_norms(program, homes, steps);
    rotate_in_gemv(program, steps);
    let mut half = half_product_inputs(program, steps);
    half.extend(half_product_outputs(program, steps));
    half
}

/// Values stored in a half type where a matrix's route at the step's rows
/// says so, by what decides it.
#[derive(Clone, Copy, Debug)]
pub enum HalfStore {
    /// x of the products that alone read it, written by its producer in
    /// the half type those take x in (`products::x_half_type` of this
    /// matrix: past the decode GEMV), so the products need no cast.
    ProductInput(DeviceMatrix),
    /// The output of a product over this matrix that only generated kernels
    /// read (which take it as `load_as` says): W's half type where cuBLAS
    /// computes it (`products::y_half_type`).
    ProductOutput(DeviceMatrix),
}

/// The values stored in a half type ([`HalfStore`]).
pub type HalfValues = HashMap<ValueId, HalfStore>;

/// Finds the outputs of products (single or grouped) that only generated
/// kernels read: a gated MLP's gate and up past the decode GEMV, an MLP's
/// first product before its activation, a bias add. Where cuBLAS computes
/// them it stores them in W's half type, the generated kernels read that:
/// by arithmetic, at a 2048-token Llama-3-8B prefill gate's and up's 235 MB
/// a layer of f32 writes and as many reads become half that (~1.8 ms of a
/// prefill at 4.16 TB/s).
fn half_product_outputs(program: &Program, steps: &[StepPlan]) -> HalfValues {
    let readers = readers(program);
    let generated = |r: &Option<usize>| {
        r.is_some_and(|r| {
            matches!(
                steps[r],
                StepPlan::Fused(..) | StepPlan::GatedActivation { .. }
            )
        })
    };
    let mut half = HalfValues::new();
    for (step, plan) in program.steps.iter().zip(steps) {
        let members = match plan {
            StepPlan::Linear(w) => vec![(*w, step.output)],
            StepPlan::LinearGroup { members, .. } => members.clone(),
            _ => continue,
        };
        for (w, v) in members {
            let is_f32 = program.graph.nodes[v as usize].ty.dtype == DType::F32;
            if is_f32 && readers.get(&v).is_some_and(|r| r.iter().all(generated)) {
                half.insert(v, HalfStore::ProductOutput(w));
            }
        }
    }
    half
}

/// Finds the x of `Linear` products (single or grouped) that only those
/// products read and that an RMS norm (fused with its residual add or not),
/// a generated f32 kernel (a gated MLP's activation among them) or a paged
/// attention (x its heads side by side, a reshape of its output) writes: the
/// producer can store it in the products' half type. By arithmetic, at a
/// 2048-token Llama-3-8B prefill that is ~440 MB a layer of f32 writes and
/// cast passes not made (the two norms' outputs, the activation's and the
/// attention's).
fn half_product_inputs(program: &Program, steps: &[StepPlan]) -> HalfValues {
    let computed_at = computed_at(program, steps);
    let readers = readers(program);
    let read_only_by = |v: ValueId, s: usize| read_only_by(&readers, steps, v, s);
    let is_f32 = |v: ValueId| program.graph.nodes[v as usize].ty.dtype == DType::F32;
    let mut half = HalfValues::new();
    for (s, step) in program.steps.iter().enumerate() {
        let matrix = match &steps[s] {
            StepPlan::Linear(w) => *w,
            StepPlan::LinearGroup { members, .. } => members[0].0,
            _ => continue,
        };
        let x = step.inputs[0];
        let Some(&p) = computed_at.get(&x) else {
            continue;
        };
        if !read_only_by(x, s) || !is_f32(x) {
            continue;
        }
        let producer = &program.steps[p];
        let stores_half = match &steps[p] {
            StepPlan::AddRmsNorm(norm)
            | StepPlan::NormAddRmsNorm { norm, .. }
            | StepPlan::AddRmsNormRows { norm, .. }
            | StepPlan::Embedding {
                norm: Some(norm), ..
            } => norm.output == x,
            StepPlan::RmsNorm { .. } | StepPlan::Fused(..) | StepPlan::GatedActivation { .. } => {
                producer.output == x
            }
            StepPlan::Alias => {
                let heads = producer.inputs[0];
                let attention = computed_at.get(&heads).is_some_and(|&a| {
                    matches!(steps[a], StepPlan::Attention { .. })
                        && program.steps[a].output == heads
                });
                let stores = attention && read_only_by(heads, p) && is_f32(heads);
                if stores {
                    half.insert(heads, HalfStore::ProductInput(matrix));
                }
                stores
            }
            _ => false,
        };
        if stores_half {
            half.insert(x, HalfStore::ProductInput(matrix));
        }
    }
    half
}

/// The activation of a gated MLP (and of a mixture's experts), numbered as
/// `kiln_gated` in `kernels/cuda/kiln_cuda.cuh` numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GatedActivation {
    /// SiLU (SwiGLU).
    Silu = 1,
    /// GELU with the exact erf (GeGLU).
    Gelu = 2,
    /// GELU's tanh approximation (Gemma).
    GeluTanh = 3,
    /// ReLU.
    Relu = 4,
}

impl GatedActivation {
    /// The activation `f` names, where the kernels have it.
    pub fn of(f: UnaryOp) -> Option<Self> {
        Some(match f {
            UnaryOp::Silu => Self::Silu,
            UnaryOp::Gelu => Self::Gelu,
            UnaryOp::GeluTanh => Self::GeluTanh,
            UnaryOp::Relu => Self::Relu,
            _ => return None,
        })
    }
}

/// A [`StepPlan::LinearGroup`] of a gated MLP's two products.
#[derive(Clone, Copy, Debug)]
pub struct GatedProduct {
    /// The activation applied to gate.
    pub activation: GatedActivation,
    /// Which member is gate (the other is up).
    pub gate: usize,
    /// The value `act(gate) · up`.
    pub output: ValueId,
    /// Gate and up are stored stacked ([`StepPlan::GatedActivation`]'s).
    pub stacked: bool,
}

/// Puts `Linear` steps that read the same value with matrices of one type
/// and width into one [`StepPlan::LinearGroup`] at the first of them, up to
/// [`GEMV_MAX_GROUP`] at a time, where a [`GemvGroup`] holds them: one
/// format, or one but the last (a mixed *_K_M file's q and k with its v);
/// else by format. The others become [`StepPlan::ComputedAt`]: their
/// outputs are written at the group's step (the memory plan keeps them
/// live from there).
fn group_products(program: &Program, steps: &mut [StepPlan]) {
    // Each Linear step (index, matrix, output) by what it shares.
    let mut groups: HashMap<_, Vec<(usize, DeviceMatrix, ValueId)>> = HashMap::new();
    for (s, (step, plan)) in program.steps.iter().zip(steps.iter()).enumerate() {
        if let StepPlan::Linear(w) = plan {
            let key = (step.inputs[0], w.ty, w.cols, w.int8_activations);
            groups.entry(key).or_default().push((s, *w, step.output));
        }
    }
    for members in groups.into_values() {
        for chunk in launches_of(members).into_iter().filter(|c| c.len() > 1) {
            let at = chunk.iter().map(|&(s, _, _)| s).min().unwrap_or(0);
            steps[at] = StepPlan::LinearGroup {
                members: chunk.iter().map(|&(_, w, v)| (w, v)).collect(),
                gated: None,
                rotation: None,
            };
            for &(s, _, _) in chunk.iter().filter(|&&(s, _, _)| s != at) {
                steps[s] = StepPlan::ComputedAt { at };
            }
        }
    }
}

/// The GEMV launches of products that share x (in program order): all in
/// one where a [`GemvGroup`] holds them, the odd format last; else each
/// format's in launches of up to [`GEMV_MAX_GROUP`].
fn launches_of<T: Copy>(
    members: Vec<(usize, DeviceMatrix, T)>,
) -> Vec<Vec<(usize, DeviceMatrix, T)>> {
    let mut by_format: Vec<Vec<(usize, DeviceMatrix, T)>> = Vec::new();
    for member in members {
        match by_format
            .iter_mut()
            .find(|f| f[0].1.packed == member.1.packed)
        {
            Some(format) => format.push(member),
            None => by_format.push(vec![member]),
        }
    }
    // The larger format first, the other (a single matrix) last.
    by_format.sort_by_key(|f| std::cmp::Reverse(f.len()));
    let together: Vec<_> = by_format.concat();
    let fits = together.len() <= GEMV_MAX_GROUP;
    if by_format.len() == 2 && fits && GemvGroup::of(together.iter().map(|m| &m.1)).is_some() {
        return vec![together];
    }
    by_format
        .into_iter()
        .flat_map(|f| {
            f.chunks(GEMV_MAX_GROUP)
                .map(<[_]>::to_vec)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `act(Input(a)) · Input(b)` in either order, all f32: the activation and
/// `(a, b)`.
fn gated_pattern(instrs: &[Instr]) -> Option<(GatedActivation, usize, usize)> {
    let [Instr {
        op: ElementOp::Unary { f },
        args: unary_args,
        dtype: DType::F32,
    }, Instr {
        op: ElementOp::Binary { f: BinaryOp::Mul },
        args: mul_args,
        dtype: DType::F32,
    }] = instrs
    else {
        return None;
    };
    let activation = GatedActivation::of(*f)?;
    let &[Operand::Input(a)] = unary_args.as_slice() else {
        return None;
    };
    let b = match mul_args.as_slice() {
        &[Operand::Reg(0), Operand::Input(b)] | &[Operand::Input(b), Operand::Reg(0)] => b,
        _ => return None,
    };
    (a != b).then_some((activation, a, b))
}

/// Hands a gated MLP's activation `act(gate) · up` (a generated kernel of
/// two f32 inputs of its shape) to the [`StepPlan::LinearGroup`] of exactly
/// its gate and up products, when nothing else reads them: the decode GEMV
/// then writes the activation's output itself (larger batches still run
/// the kernel, [`StepPlan::GatedActivation`]).
fn fuse_gated_activations(program: &Program, steps: &mut [StepPlan]) {
    let computed_at = computed_at(program, steps);
    let readers = readers(program);
    for (j, step) in program.steps.iter().enumerate() {
        let (StepPlan::Fused(fused, inputs), Kernel::Fused { program: instrs }) =
            (&steps[j], &step.kernel)
        else {
            continue;
        };
        let Some((activation, a, b)) = gated_pattern(instrs) else {
            continue;
        };
        let (gate, up) = (step.inputs[a], step.inputs[b]);
        let whole = inputs.iter().all(|i| i.same_shape && i.dtype == DType::F32);
        let only_here = readers[&gate].len() == 1 && readers[&up].len() == 1;
        let Some(&at) = computed_at.get(&gate) else {
            continue;
        };
        if !whole || !only_here || computed_at.get(&up) != Some(&at) {
            continue;
        }
        let fused = *fused;
        let StepPlan::LinearGroup { members, gated, .. } = &mut steps[at] else {
            continue;
        };
        let outputs: Vec<ValueId> = members.iter().map(|&(_, v)| v).collect();
        let Some(gate_index) = outputs.iter().position(|&v| v == gate) else {
            continue;
        };
        // Gate and up of one format: the launches past the GEMV pair them.
        let one_format = members.iter().all(|(w, _)| w.packed == members[0].0.packed);
        if outputs.len() != 2 || !outputs.contains(&up) || gated.is_some() || !one_format {
            continue;
        }
        let matrices = [members[0].0, members[1].0];
        let stacked = Stack::in_place(&matrices, 1, GemmType::F32).is_some();
        *gated = Some(GatedProduct {
            activation,
            gate: gate_index,
            output: step.output,
            stacked,
        });
        let matrix = members[0].0;
        steps[j] = StepPlan::GatedActivation {
            at,
            matrix,
            fused,
            stacked,
        };
    }
}

/// The program step writing each value.
pub(super) fn step_of_output(program: &Program) -> HashMap<ValueId, usize> {
    program
        .steps
        .iter()
        .enumerate()
        .map(|(s, step)| (step.output, s))
        .collect()
}

/// Each RMS norm step whose weight is on the device, with the step that
/// writes its input: (the norm's step, that step, the norm).
pub(super) fn norms_after_producers(
    program: &Program,
    homes: &[Home],
    steps: &[StepPlan],
) -> Vec<(usize, usize, RowNorm)> {
    let producer = step_of_output(program);
    let mut found = Vec::new();
    for (j, step) in program.steps.iter().enumerate() {
        let StepPlan::RmsNorm { eps, offset } = steps[j] else {
            continue;
        };
        let (x, weight) = (step.inputs[0], step.inputs[1]);
        let weight_ready = matches!(homes[weight as usize], Home::Persistent(_));
        if let (Some(&i), true) = (producer.get(&x), weight_ready) {
            let norm = RowNorm {
                eps,
                offset,
                weight,
                output: step.output,
            };
            found.push((j, i, norm));
        }
    }
    found
}

/// Fuses a residual add into the RMS norm that reads its sum: an f32 step
/// `x = a + b` (two inputs of x's shape) and a later `rms_norm(x, w)` with a
/// weight on the device become one [`StepPlan::AddRmsNorm`] at the add,
/// writing both x and the norm.
fn fuse_add_rms_norm(program: &Program, homes: &[Home], steps: &mut [StepPlan]) {
    let graph = &program.graph;
    for (j, i, norm) in norms_after_producers(program, homes, steps) {
        let add = &program.steps[i];
        let x = add.output;
        let plain_add = binary_f32(program, i) == Some((BinaryOp::Add, true));
        let same_shape = add
            .inputs
            .iter()
            .all(|&v| graph.nodes[v as usize].ty == graph.nodes[x as usize].ty);
        if plain_add && same_shape && matches!(steps[i], StepPlan::Fused(..)) {
            steps[i] = StepPlan::AddRmsNorm(norm);
            steps[j] = StepPlan::ComputedAt { at: i };
        }
    }
}

/// Step `s`'s operation where it is one f32 binary operation of its two
/// inputs (a generated kernel of one instruction, or the graph's node), and
/// whether it takes them in order (`inputs[0] op inputs[1]`).
pub(super) fn binary_f32(program: &Program, s: usize) -> Option<(BinaryOp, bool)> {
    let step = &program.steps[s];
    if step.inputs.len() != 2 {
        return None;
    }
    let (a, b) = (Operand::Input(0), Operand::Input(1));
    match &step.kernel {
        Kernel::Fused { program: instrs } => match instrs.as_slice() {
            [Instr {
                op: ElementOp::Binary { f },
                args,
                dtype: DType::F32,
            }] if args == &[a, b] || args == &[b, a] => Some((*f, args == &[a, b])),
            _ => None,
        },
        Kernel::Node => {
            let node = &program.graph.nodes[step.output as usize];
            match node.op {
                Op::Binary { op } if node.ty.dtype == DType::F32 => Some((op, true)),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Runs two rotations of the same positions and frequencies (q's and k's)
/// in one launch at the first, when the second's input is computed before
/// the first runs.
fn pair_rotations(program: &Program, steps: &mut [StepPlan]) {
    let computed_at = computed_at(program, steps);
    let mut first_of: HashMap<(ValueId, ValueId), usize> = HashMap::new();
    for (j, step) in program.steps.iter().enumerate() {
        let StepPlan::Rope {
            interleaved,
            scale,
            with: None,
            ..
        } = steps[j]
        else {
            continue;
        };
        let key = (step.inputs[1], step.inputs[2]);
        let Some(&i) = first_of.get(&key) else {
            first_of.insert(key, j);
            continue;
        };
        let input_ready = computed_at.get(&step.inputs[0]).is_none_or(|&at| at < i);
        let same_rotation = matches!(
            steps[i],
            StepPlan::Rope { interleaved: a, scale: b, with: None, .. } if a == interleaved && b == scale
        );
        if input_ready && same_rotation {
            if let StepPlan::Rope { with, .. } = &mut steps[i] {
                *with = Some((step.inputs[0], step.output));
            }
            steps[j] = StepPlan::ComputedAt { at: i };
            first_of.remove(&key);
        }
    }
}

/// The steps that read each value, in order; a graph output is read by the
/// caller (`None`).
pub(super) fn readers(program: &Program) -> HashMap<ValueId, Vec<Option<usize>>> {
    let mut readers: HashMap<ValueId, Vec<Option<usize>>> = HashMap::new();
    for (s, step) in program.steps.iter().enumerate() {
        for &v in &step.inputs {
            readers.entry(v).or_default().push(Some(s));
        }
    }
    for &v in &program.graph.outputs {
        readers.entry(v).or_default().push(None);
    }
    readers
}

/// Whether launch `s` alone reads `v` (`readers` as [`readers`] gives
/// them): its step, or steps it computes ([`StepPlan::ComputedAt`]).
pub(super) fn read_only_by(
    readers: &HashMap<ValueId, Vec<Option<usize>>>,
    steps: &[StepPlan],
    v: ValueId,
    s: usize,
) -> bool {
    readers[&v].iter().all(|&r| {
        r.is_some_and(|r| r == s || matches!(steps[r], StepPlan::ComputedAt { at } if at == s))
    })
}

/// Whether only paged attentions whose cache write another launch does read
/// `v` (so none of them reads it: they read the cache).
fn read_only_by_cached_attention(
    readers: &HashMap<ValueId, Vec<Option<usize>>>,
    steps: &[StepPlan],
    v: ValueId,
) -> bool {
    let reads_the_cache = |r: &Option<usize>| {
        matches!(
            r.map(|r| &steps[r]),
            Some(StepPlan::Attention {
                cache_written: true,
                ..
            })
        )
    };
    readers
        .get(&v)
        .is_some_and(|r| r.iter().all(reads_the_cache))
}

/// The step whose launch computes each value (itself, or the step that
/// computes it with its own: see [`StepPlan::ComputedAt`]).
pub(super) fn computed_at(program: &Program, steps: &[StepPlan]) -> HashMap<ValueId, usize> {
    let mut at = HashMap::new();
    for (s, step) in program.steps.iter().enumerate() {
        let by = match steps[s] {
            StepPlan::ComputedAt { at } => at,
            _ => s,
        };
        at.insert(step.output, by);
    }
    at
}

/// Moves a paged attention's cache write into the paired rotation of q and
/// k that produces its keys, when its values are computed before that
/// launch: one launch a layer fewer, and the keys written as rotated.
fn write_cache_with_rotations(program: &Program, steps: &mut [StepPlan]) {
    let computed_at = computed_at(program, steps);
    // The paired rotation writing each value as its second output.
    let mut rotation_of: HashMap<ValueId, usize> = HashMap::new();
    for (i, plan) in steps.iter().enumerate() {
        if let StepPlan::Rope {
            with: Some((_, k)), ..
        } = plan
        {
            rotation_of.insert(*k, i);
        }
    }
    for (s, step) in program.steps.iter().enumerate() {
        let StepPlan::Attention { spec, .. } = &steps[s] else {
            continue;
        };
        let (k, v) = (step.inputs[1], step.inputs[2]);
        let Some(&i) = rotation_of.get(&k) else {
            continue;
        };
        let v_ready = computed_at.get(&v).is_none_or(|&at| at < i);
        if !v_ready || i >= s {
            continue;
        }
        let write = CacheWrite {
            v,
            batch: [step.inputs[3], step.inputs[4], step.inputs[5]],
            layer: spec.layer,
        };
        if let StepPlan::Attention { cache_written, .. } = &mut steps[s] {
            *cache_written = true;
        }
        if let StepPlan::Rope { cache_write, .. } = &mut steps[i] {
            *cache_write = Some(write);
        }
        rotation_of.remove(&k);
    }
}

/// Moves a paired rotation of q and k (and its cache write) into the GEMV
/// of q, k and v that writes them ([`GroupRotation`]), where the group's
/// members are q, k (and v) in that order, q and k reach the rotation only
/// through a reshape each, and the cache write takes v (or a reshape of
/// it): at decode one launch a layer fewer, q and k not written unrotated.
/// Past the decode GEMV the rotary launch runs as before, reading the
/// output of their one GEMM where they are stored stacked (no split of its
/// columns).
fn rotate_in_gemv(program: &Program, steps: &mut [StepPlan]) {
    let computed_at = computed_at(program, steps);
    let readers = readers(program);
    let read_only_by = |v: ValueId, s: usize| read_only_by(&readers, steps, v, s);
    // The value a reshape `v` reads, when that reshape alone reads it.
    let reshaped = |v: ValueId| {
        let at = *computed_at.get(&v)?;
        let input = program.steps[at].inputs.first().copied()?;
        (matches!(steps[at], StepPlan::Alias) && read_only_by(input, at)).then_some(input)
    };
    let mut moves = Vec::new();
    for i in 0..steps.len() {
        let StepPlan::Rope {
            interleaved,
            scale,
            with: Some((k_in, k_out)),
            cache_write,
            in_group: None,
            head_norms: None,
        } = steps[i]
        else {
            continue;
        };
        let rope = &program.steps[i];
        let (q_in, positions, inv_freq) = (rope.inputs[0], rope.inputs[1], rope.inputs[2]);
        let (Some(q), Some(k)) = (reshaped(q_in), reshaped(k_in)) else {
            continue;
        };
        if !read_only_by(q_in, i) || !read_only_by(k_in, i) {
            continue;
        }
        let Some(&g) = computed_at.get(&q) else {
            continue;
        };
        let StepPlan::LinearGroup {
            members,
            gated: None,
            rotation: None,
        } = &steps[g]
        else {
            continue;
        };
        let outputs: Vec<ValueId> = members.iter().map(|&(_, v)| v).collect();
        let v = cache_write.map(|w| reshaped(w.v).unwrap_or(w.v));
        let in_order = match (outputs.as_slice(), v) {
            ([a, b, c], Some(v)) => [*a, *b, *c] == [q, k, v],
            ([a, b, ..], None) => [*a, *b] == [q, k],
            _ => false,
        };
        let ready = |v: ValueId| computed_at.get(&v).is_none_or(|&at| at < g);
        let group = GemvGroup::of(members.iter().map(|(w, _)| w))
            .filter(|_| in_order && ready(positions) && ready(inv_freq));
        let Some(group) = group else {
            continue;
        };
        let matrices: Vec<DeviceMatrix> = members.iter().map(|&(w, _)| w).collect();
        // Past the GEMV, v's own value is not written (the rotary launch
        // writes the cache, which the attention reads): only where nothing
        // else reads it.
        let stacked = cache_write
            .is_some_and(|w| read_only_by_cached_attention(&readers, steps, w.v))
            && matrices.len() == 3
            && Stack::in_place(&matrices, 1, GemmType::F32).is_some();
        let moved = GroupRotation {
            interleaved,
            scale,
            positions,
            inv_freq,
            q_out: rope.output,
            k_out,
            cache_write,
            stacked,
        };
        let group = RotatingGroup {
            gemv: group,
            stacked,
        };
        moves.push((g, i, moved, group));
    }
    for (g, i, moved, group) in moves {
        if let StepPlan::LinearGroup { rotation, .. } = &mut steps[g] {
            *rotation = Some(moved);
        }
        if let StepPlan::Rope { in_group, .. } = &mut steps[i] {
            *in_group = Some(group);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instr(op: ElementOp, args: &[Operand]) -> Instr {
        Instr {
            op,
            args: args.to_vec(),
            dtype: DType::F32,
        }
    }

    fn unary(f: UnaryOp, a: Operand) -> Instr {
        instr(ElementOp::Unary { f }, &[a])
    }

    fn mul(a: Operand, b: Operand) -> Instr {
        instr(ElementOp::Binary { f: BinaryOp::Mul }, &[a, b])
    }

    #[test]
    fn a_gated_activation_is_recognized_in_either_order_and_nothing_else() {
        use Operand::{Input, Reg};
        let silu = unary(UnaryOp::Silu, Input(1));
        assert_eq!(
            gated_pattern(&[silu.clone(), mul(Reg(0), Input(0))]),
            Some((GatedActivation::Silu, 1, 0))
        );
        let gelu = unary(UnaryOp::GeluTanh, Input(0));
        assert_eq!(
            gated_pattern(&[gelu, mul(Input(1), Reg(0))]),
            Some((GatedActivation::GeluTanh, 0, 1))
        );
        // An activation the GEMV does not apply, x·act(x), a sum, a third
        // instruction, another type: the generated kernel stays.
        let sigmoid = unary(UnaryOp::Sigmoid, Input(0));
        assert_eq!(gated_pattern(&[sigmoid, mul(Reg(0), Input(1))]), None);
        assert_eq!(gated_pattern(&[silu.clone(), mul(Reg(0), Input(1))]), None);
        let add = instr(ElementOp::Binary { f: BinaryOp::Add }, &[Reg(0), Input(0)]);
        assert_eq!(gated_pattern(&[silu.clone(), add]), None);
        let scaled = [silu.clone(), mul(Reg(0), Input(0)), mul(Reg(1), Input(2))];
        assert_eq!(gated_pattern(&scaled), None);
        let bf16 = Instr {
            dtype: DType::BF16,
            ..mul(Reg(0), Input(0))
        };
        assert_eq!(gated_pattern(&[silu, bf16]), None);
    }

    #[test]
    fn products_sharing_x_launch_together_with_the_odd_format_last() {
        use kiln_kernels::quant::QuantType;
        let w = |p: QuantType| DeviceMatrix::unplaced(Some(p), 1024, 4096);
        let steps = |members: &[(usize, QuantType)]| {
            let members = members.iter().map(|&(s, p)| (s, w(p), ())).collect();
            let launches = launches_of(members);
            launches
                .iter()
                .map(|l| l.iter().map(|&(s, _, _)| s).collect::<Vec<_>>())
                .collect::<Vec<_>>()
        };
        let (q4, q6, q8) = (QuantType::Q4K, QuantType::Q6K, QuantType::Q8_0);
        assert_eq!(steps(&[(0, q4), (1, q4), (2, q6)]), [vec![0, 1, 2]]);
        assert_eq!(steps(&[(0, q4), (1, q6), (2, q4)]), [vec![0, 2, 1]]);
        // No kernel pairs Q8_0 with Q6_K, nor takes three formats.
        assert_eq!(steps(&[(0, q8), (1, q6)]), [vec![0], vec![1]]);
        assert_eq!(
            steps(&[(0, q4), (1, q6), (2, q8)]),
            [vec![0], vec![1], vec![2]]
        );
        let five: Vec<(usize, QuantType)> = (0..5).map(|s| (s, q4)).collect();
        assert_eq!(steps(&five), [vec![0, 1, 2, 3], vec![4]]);
    }

    #[test]
    fn v_goes_unwritten_only_where_attentions_reading_the_cache_alone_read_it() {
        let attention = |cache_written| StepPlan::Attention {
            spec: kiln_plugin_api::graph::AttentionSpec {
                layer: 0,
                scale: 1.0,
                sliding_window: None,
                softcap: None,
            },
            cache_written,
        };
        let steps = [attention(true), attention(false), StepPlan::Alias];
        let only = |readers: Vec<Option<usize>>| {
            let readers = HashMap::from([(7, readers)]);
            read_only_by_cached_attention(&readers, &steps, 7)
        };
        assert!(only(vec![Some(0)]));
        // An attention writing the cache itself reads v, as does any other
        // step, or the graph's output.
        assert!(!only(vec![Some(0), Some(1)]));
        assert!(!only(vec![Some(0), Some(2)]));
        assert!(!only(vec![Some(0), None]));
        let no_readers = HashMap::new();
        assert!(!read_only_by_cached_attention(&no_readers, &steps, 7));
    }
}
