//! The shared GPU compiler's code generator: a fused element-wise chain of
//! the [`Program`](crate::compiler::Program) becomes one CUDA C kernel,
//! `kiln_fused`, each thread taking [`ELEMENTS_PER_THREAD`] output elements
//! a block's width apart (every load of a warp coalesced), their inputs
//! loaded before any is used (so a thread has them all in flight at once),
//! each input read through its broadcast strides (or at the element's own
//! index when its shape is the output's). The same text is compiled by
//! NVRTC for a GPU and by the host C++ compiler for the emulator, and can
//! be dumped for review (`KILN_DUMP_KERNELS`).

use std::fmt::Write as _;

use kiln_kernels::cuda::{GemmType, KernelArg};
use kiln_plugin_api::graph::{BinaryOp, DType, UnaryOp};

use crate::compiler::{ElementOp, Instr, Operand};
use crate::runtime::tensor::{storage_of, Storage};

/// Output elements each thread of a generated kernel takes: a decode step's
/// activation over 64 rows of 14,336 is then one wave of 896 blocks of 256
/// threads (a thread an element took 3,584 blocks, 7.06 µs on the H200).
pub const ELEMENTS_PER_THREAD: usize = 4;

/// Output elements each thread of a generated kernel's vector path takes
/// (see `vector_path`), four groups of four: the host sizes the grid by it
/// where the path applies ([`vector_path_applies`]).
pub const VECTOR_ELEMENTS_PER_THREAD: usize = 16;

/// Dimensions a fused kernel's shape argument holds.
pub const MAX_RANK: usize = 8;

/// The name of every generated kernel.
pub const KERNEL: &str = "kiln_fused";

/// One external operand of a fused kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusedInput {
    /// Its type.
    pub dtype: DType,
    /// True when its shape is the output's (read at the element's index).
    pub same_shape: bool,
}

/// Inputs whose storage a generated kernel takes at run time: the first
/// [`HALF_INPUTS`] f32 ones may be stored in bf16 or f16 instead, two bits
/// each of the `in_types` argument ([`input_types_arg`]).
pub const HALF_INPUTS: usize = 32;

/// The `in_types` argument of a generated kernel: each input's storage
/// (`None`: f32; `load_as` in kiln_cuda.cuh), two bits an input, numbered
/// as `out_type`. Fails for a half input past [`HALF_INPUTS`].
pub fn input_types_arg(
    halves: impl Iterator<Item = Option<GemmType>>,
) -> Result<KernelArg, String> {
    let mut word = 0u64;
    for (i, half) in halves.enumerate() {
        let code = u64::from(super::products::storage_code(half));
        if i < HALF_INPUTS {
            word |= code << (2 * i);
        } else if code != 0 {
            return Err(format!(
                "input {i} of a generated kernel is stored in a half type"
            ));
        }
    }
    Ok(KernelArg::I64(word as i64))
}

/// CUDA C for `program` over `inputs`, producing `output`. Fails naming the
/// first operation the generator does not cover. The kernel's argument
/// `out_type` has an f32 result stored in bf16 or f16 instead, for matrix
/// products that read it in that type (`fusion.rs`); `in_types` says which
/// f32 inputs are stored so (products' outputs: [`input_types_arg`]).
pub fn generate(program: &[Instr], inputs: &[FusedInput], output: DType) -> Result<String, String> {
    // Each input's values for the thread's elements (`a{i}_[e]`), then
    // each element's chain reading them as `a{i}`.
    let mut loads = String::new();
    let mut body = String::new();
    let mut regs: Vec<Storage> = Vec::with_capacity(program.len());
    for (i, input) in inputs.iter().enumerate() {
        let load = match storage_of(input.dtype) {
            Storage::F32 if i < HALF_INPUTS => {
                format!("load_as(in{i}, o{i}, (int)((in_types >> {}) & 3))", 2 * i)
            }
            Storage::F32 | Storage::I64 => format!("in{i}[o{i}]"),
            Storage::Bool => format!("in{i}[o{i}] != 0"),
        };
        let ty = c_type(storage_of(input.dtype));
        let _ = writeln!(loads, "        a{i}_[e] = {load};");
        let _ = writeln!(body, "        const {ty} a{i} = a{i}_[e];");
    }
    for (r, instr) in program.iter().enumerate() {
        let args: Vec<(String, Storage)> = instr
            .args
            .iter()
            .map(|a| match *a {
                Operand::Input(i) => (format!("a{i}"), storage_of(inputs[i].dtype)),
                Operand::Reg(j) => (format!("r{j}"), regs[j]),
            })
            .collect();
        let storage = storage_of(instr.dtype);
        let expr = expression(instr, &args)?;
        let expr = match instr.dtype {
            DType::BF16 => format!("round_bf16({expr})"),
            DType::F16 => format!("round_f16({expr})"),
            DType::I32 => format!("(i64)(int)({expr})"),
            DType::U8 => format!("(i64)(unsigned char)({expr})"),
            _ => expr,
        };
        let _ = writeln!(body, "        const {} r{r} = {expr};", c_type(storage));
        regs.push(storage);
    }
    let last = program
        .len()
        .checked_sub(1)
        .ok_or("an empty fused program")?;
    if regs[last] != storage_of(output) {
        return Err("the fused program's result has the wrong type".to_owned());
    }
    // An f32 result is stored as `out_type` says: f32, or the half type of
    // the products that read it (`store_as`).
    let store = match storage_of(output) {
        Storage::Bool => format!("out[i] = r{last} ? 1 : 0;"),
        Storage::F32 => format!("store_as(out, i, r{last}, out_type);"),
        Storage::I64 => format!("out[i] = r{last};"),
    };

    let mut text =
        String::from("// Generated by Kiln's GPU compiler: one fused element-wise chain.\n");
    text.push_str("#include \"kiln_cuda.cuh\"\n\n");
    let _ = writeln!(
        text,
        "struct KilnFusedShape {{\n  int rank;\n  i64 shape[{MAX_RANK}];\n  i64 strides[{}][{MAX_RANK}];\n  i64 count;\n}};\n",
        inputs.len().max(1)
    );
    let mut params = vec![format!(
        "{}* __restrict__ out",
        memory_type(storage_of(output))
    )];
    for (i, input) in inputs.iter().enumerate() {
        params.push(format!(
            "const {}* __restrict__ in{i}",
            memory_type(storage_of(input.dtype))
        ));
    }
    params.push("KilnFusedShape s".to_owned());
    params.push("int out_type".to_owned());
    params.push("i64 in_types".to_owned());
    let _ = writeln!(
        text,
        "extern \"C\" __global__ void {KERNEL}({}) {{",
        params.join(", ")
    );
    // Launched as a programmatic dependent: see `kiln_wait_inputs`.
    text.push_str("  kiln_wait_inputs();\n");
    if has_vector_path(inputs, output) {
        text.push_str(&vector_path(inputs.len(), &body, last));
    }
    let _ = writeln!(
        text,
        "  const i64 chunk = (i64)blockDim.x * {ELEMENTS_PER_THREAD};\n  \
         for (i64 start = (i64)blockIdx.x * chunk; start < s.count; start += (i64)gridDim.x * chunk) {{"
    );
    for (i, input) in inputs.iter().enumerate() {
        let ty = c_type(storage_of(input.dtype));
        let _ = writeln!(text, "    {ty} a{i}_[{ELEMENTS_PER_THREAD}] = {{}};");
    }
    let element = format!(
        "#pragma unroll\n    for (int e = 0; e < {ELEMENTS_PER_THREAD}; ++e) {{\n      \
         const i64 i = start + (i64)e * blockDim.x + threadIdx.x;\n      if (i < s.count) {{"
    );
    let _ = writeln!(text, "{element}");
    // A broadcast input's offset loop stays rolled: unrolled in each of the
    // thread's elements, NVRTC took 7.6 s for a kernel it compiled in 0.5.
    for (i, input) in inputs.iter().enumerate() {
        if input.same_shape {
            let _ = writeln!(text, "        const i64 o{i} = i;");
        } else {
            let _ = writeln!(
                text,
                "        i64 o{i} = 0;\n        {{\n          i64 rest = i;\n#pragma unroll 1\n          for (int d = s.rank - 1; d >= 0; --d) {{\n            o{i} += (rest % s.shape[d]) * s.strides[{i}][d];\n            rest /= s.shape[d];\n          }}\n        }}"
            );
        }
    }
    text.push_str(&loads);
    let _ = writeln!(text, "      }}\n    }}\n{element}");
    text.push_str(&body);
    let _ = writeln!(text, "        {store}\n      }}\n    }}\n  }}\n}}");
    Ok(text)
}

/// Whether a launch over `count` elements whose output and inputs are at
/// `addresses` takes the vector path of a kernel that has one (its
/// condition, which the kernel checks again): the host then sizes the grid
/// by [`VECTOR_ELEMENTS_PER_THREAD`].
pub fn vector_path_applies(count: usize, mut addresses: impl Iterator<Item = u64>) -> bool {
    count.is_multiple_of(4) && addresses.all(|a| a % 16 == 0)
}

/// Whether the kernel over `inputs` has the vector path ([`vector_path`]):
/// every input read at the element's own index, all of them and the output
/// f32 values (possibly stored in a half type).
pub fn has_vector_path(inputs: &[FusedInput], output: DType) -> bool {
    inputs.len() <= HALF_INPUTS
        && storage_of(output) == Storage::F32
        && inputs
            .iter()
            .all(|i| i.same_shape && storage_of(i.dtype) == Storage::F32)
}

/// The path a generated kernel takes where the element count is a multiple
/// of 4 and every address 16-byte aligned: a thread takes
/// [`VECTOR_ELEMENTS_PER_THREAD`] elements as groups of four consecutive
/// ones a block's width of groups apart, each input's group in one load
/// (16 bytes of f32, 8 of a half type) and all of them issued before any
/// is used, the result's group in one store. The element-wise path's
/// threads held a 2048-token Llama-3-8B prefill's activation (176 MB of
/// bf16 a layer) to 2.1 TB/s on the H200 (84.8 µs, 28,672 blocks of 256
/// threads, 2026-11-30): each block's four 2-byte loads a thread an input
/// were one memory round trip, ~27 waves of blocks of one round trip each;
/// here a wave moves four times the bytes in a quarter of the blocks.
/// `body` computes `r{last}` from `a{i}_[e]`.
fn vector_path(inputs: usize, body: &str, last: usize) -> String {
    const GROUPS: usize = VECTOR_ELEMENTS_PER_THREAD / 4;
    let mut aligned = vec!["s.count % 4 == 0".to_owned(), "aligned16(out)".to_owned()];
    aligned.extend((0..inputs).map(|i| format!("aligned16(in{i})")));
    let mut text = format!("  if ({}) {{\n", aligned.join(" && "));
    let _ = writeln!(
        text,
        "    const i64 chunk = (i64)blockDim.x * {VECTOR_ELEMENTS_PER_THREAD};\n    \
         for (i64 start = (i64)blockIdx.x * chunk; start < s.count; start += (i64)gridDim.x * chunk) {{"
    );
    for i in 0..inputs {
        let _ = writeln!(text, "      float a{i}_[{VECTOR_ELEMENTS_PER_THREAD}];");
    }
    let group = format!(
        "#pragma unroll\n      for (int g = 0; g < {GROUPS}; ++g) {{\n        \
         const i64 i = start + 4 * ((i64)g * blockDim.x + threadIdx.x);\n        if (i < s.count) {{"
    );
    let _ = writeln!(text, "{group}");
    for i in 0..inputs {
        let _ = writeln!(
            text,
            "          load4_as(in{i}, i, (int)((in_types >> {}) & 3), a{i}_ + 4 * g);",
            2 * i
        );
    }
    let _ = writeln!(text, "        }}\n      }}\n{group}");
    let _ = writeln!(
        text,
        "          float v_[4];\n#pragma unroll\n          for (int u = 0; u < 4; ++u) {{\n            \
         const int e = 4 * g + u;\n{body}            v_[u] = r{last};\n          }}\n          \
         store4_as(out, i, v_, out_type);\n        }}\n      }}\n    }}\n    return;\n  }}"
    );
    text
}

fn c_type(storage: Storage) -> &'static str {
    match storage {
        Storage::F32 => "float",
        Storage::I64 => "i64",
        Storage::Bool => "bool",
    }
}

fn memory_type(storage: Storage) -> &'static str {
    match storage {
        Storage::F32 => "float",
        Storage::I64 => "i64",
        Storage::Bool => "unsigned char",
    }
}

fn expression(instr: &Instr, args: &[(String, Storage)]) -> Result<String, String> {
    let unsupported = || {
        format!(
            "{:?} on {:?} has no CUDA code generator",
            instr.op,
            args.iter().map(|a| a.1).collect::<Vec<_>>()
        )
    };
    let a = |i: usize| args[i].0.as_str();
    Ok(match (instr.op, args) {
        (ElementOp::Unary { f }, [(x, Storage::F32)]) => unary_f32(f, x),
        (ElementOp::Unary { f: UnaryOp::Neg }, [(x, Storage::I64)]) => format!("-{x}"),
        (ElementOp::Unary { f: UnaryOp::Abs }, [(x, Storage::I64)]) => {
            format!("({x} < 0 ? -{x} : {x})")
        }
        (ElementOp::Unary { .. }, [(x, Storage::Bool)]) => format!("!{x}"),
        (ElementOp::Binary { f }, [(_, Storage::F32), (_, Storage::F32)]) => {
            binary_f32(f, a(0), a(1))
        }
        (ElementOp::Binary { f }, [(_, Storage::I64), (_, Storage::I64)]) => {
            binary_i64(f, a(0), a(1)).ok_or_else(unsupported)?
        }
        (ElementOp::Binary { f }, [(_, Storage::Bool), (_, Storage::Bool)]) => {
            let (p, q) = (a(0), a(1));
            match f {
                BinaryOp::And => format!("({p} && {q})"),
                BinaryOp::Or => format!("({p} || {q})"),
                BinaryOp::Equal => format!("({p} == {q})"),
                BinaryOp::NotEqual => format!("({p} != {q})"),
                BinaryOp::Greater => format!("({p} && !{q})"),
                BinaryOp::GreaterEqual => format!("({p} >= {q})"),
                BinaryOp::Less => format!("(!{p} && {q})"),
                BinaryOp::LessEqual => format!("({p} <= {q})"),
                _ => return Err(unsupported()),
            }
        }
        (ElementOp::Where, [(_, Storage::Bool), (_, x), (_, y)]) if x == y => {
            format!("({} ? {} : {})", a(0), a(1), a(2))
        }
        (ElementOp::Cast, [(x, from)]) => match (from, storage_of(instr.dtype)) {
            (Storage::F32, Storage::F32)
            | (Storage::I64, Storage::I64)
            | (Storage::Bool, Storage::Bool) => x.clone(),
            (Storage::I64, Storage::F32) => format!("(float){x}"),
            (Storage::Bool, Storage::F32) => format!("({x} ? 1.0f : 0.0f)"),
            (Storage::F32, Storage::I64) => format!("f32_to_i64({x})"),
            (Storage::Bool, Storage::I64) => format!("(i64)({x} ? 1 : 0)"),
            (Storage::F32, Storage::Bool) => format!("({x} != 0.0f)"),
            (Storage::I64, Storage::Bool) => format!("({x} != 0)"),
        },
        _ => return Err(unsupported()),
    })
}

fn unary_f32(f: UnaryOp, x: &str) -> String {
    match f {
        UnaryOp::Neg => format!("-{x}"),
        UnaryOp::Abs => format!("fabsf({x})"),
        UnaryOp::Exp => format!("expf({x})"),
        UnaryOp::Log => format!("logf({x})"),
        UnaryOp::Sqrt => format!("sqrtf({x})"),
        UnaryOp::Rsqrt => format!("(1.0f / sqrtf({x}))"),
        UnaryOp::Recip => format!("(1.0f / {x})"),
        UnaryOp::Square => format!("({x} * {x})"),
        UnaryOp::Sin => format!("sinf({x})"),
        UnaryOp::Cos => format!("cosf({x})"),
        UnaryOp::Tanh => format!("tanhf({x})"),
        UnaryOp::Sigmoid => format!("(1.0f / (1.0f + expf(-{x})))"),
        // Shared with the gated GEMV (`kiln_cuda.cuh`).
        UnaryOp::Relu => format!("kiln_relu({x})"),
        UnaryOp::Silu => format!("kiln_silu({x})"),
        UnaryOp::Gelu => format!("kiln_gelu({x})"),
        UnaryOp::GeluTanh => format!("kiln_gelu_tanh({x})"),
        UnaryOp::Floor => format!("floorf({x})"),
        UnaryOp::Ceil => format!("ceilf({x})"),
        UnaryOp::Not => format!("({x} == 0.0f ? 1.0f : 0.0f)"),
    }
}

/// A comparison of two numbers (f32 or i64), as C.
fn comparison(f: BinaryOp, a: &str, b: &str) -> Option<String> {
    let op = match f {
        BinaryOp::Equal => "==",
        BinaryOp::NotEqual => "!=",
        BinaryOp::Greater => ">",
        BinaryOp::GreaterEqual => ">=",
        BinaryOp::Less => "<",
        BinaryOp::LessEqual => "<=",
        _ => return None,
    };
    Some(format!("({a} {op} {b})"))
}

fn binary_f32(f: BinaryOp, a: &str, b: &str) -> String {
    let nan = "__int_as_float(0x7fc00000)";
    match f {
        BinaryOp::Add => format!("({a} + {b})"),
        BinaryOp::Sub => format!("({a} - {b})"),
        BinaryOp::Mul => format!("({a} * {b})"),
        BinaryOp::Div => format!("({a} / {b})"),
        BinaryOp::Pow => format!("powf({a}, {b})"),
        BinaryOp::Maximum => format!("(({a} != {a} || {b} != {b}) ? {nan} : fmaxf({a}, {b}))"),
        BinaryOp::Minimum => format!("(({a} != {a} || {b} != {b}) ? {nan} : fminf({a}, {b}))"),
        BinaryOp::And | BinaryOp::Or => format!(
            "({a} != 0.0f {} {b} != 0.0f)",
            if f == BinaryOp::And { "&&" } else { "||" }
        ),
        // The rest are comparisons.
        _ => comparison(f, a, b).unwrap_or_default(),
    }
}

fn binary_i64(f: BinaryOp, a: &str, b: &str) -> Option<String> {
    if let Some(c) = comparison(f, a, b) {
        return Some(c);
    }
    Some(match f {
        BinaryOp::Add => format!("(i64)((unsigned long long){a} + (unsigned long long){b})"),
        BinaryOp::Sub => format!("(i64)((unsigned long long){a} - (unsigned long long){b})"),
        BinaryOp::Mul => format!("(i64)((unsigned long long){a} * (unsigned long long){b})"),
        BinaryOp::Maximum => format!("({a} > {b} ? {a} : {b})"),
        BinaryOp::Minimum => format!("({a} < {b} ? {a} : {b})"),
        // Integer division and powers are not generated (no built-in needs
        // them); the step is refused at load instead.
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use half::bf16;
    use kiln_kernels::cuda::emulator::Emulator;
    use kiln_kernels::cuda::{Device, DevicePtr, LaunchConfig};

    use super::*;

    /// The vector path and the element-wise one compute the same values:
    /// a bf16-stored input times an f32 one, stored in bf16 and in f32, over
    /// 4,104 elements at aligned addresses (the vector path: several groups
    /// a thread, two chunks), 4,102 (not a multiple of 4) and 4,104 at
    /// addresses 4 bytes past alignment (both the element-wise path), each
    /// on the grid of either path, against the product in f32 rounded as
    /// stored; nothing past the count is written.
    #[test]
    fn both_paths_of_a_generated_kernel_agree() {
        let program = [Instr {
            op: ElementOp::Binary { f: BinaryOp::Mul },
            args: vec![Operand::Input(0), Operand::Input(1)],
            dtype: DType::F32,
        }];
        let input = FusedInput {
            dtype: DType::F32,
            same_shape: true,
        };
        let text = generate(&program, &[input, input], DType::F32).unwrap();
        assert!(text.contains("load4_as"), "no vector path:\n{text}");
        let dir = std::env::temp_dir().join("kiln-kernels").join("emulator");
        let device = Emulator::new(1 << 22, dir);
        let fused = device.load("fused.cu", &text, &[KERNEL]).unwrap()[0];
        const MAX: usize = 4104;
        let a: Vec<bf16> = (0..MAX)
            .map(|i| bf16::from_f32((i % 97) as f32 * 0.37 - 2.0))
            .collect();
        let b: Vec<f32> = (0..MAX).map(|i| 1.5 + (i % 31) as f32 * 0.113).collect();
        let put = |bytes: &[u8], skew: u64| {
            let at = device.alloc(bytes.len() + 16).unwrap() + skew;
            device.upload(at, bytes).unwrap();
            at
        };
        let a_bytes: Vec<u8> = a.iter().flat_map(|v| v.to_le_bytes()).collect();
        let b_bytes: Vec<u8> = b.iter().flat_map(|v| v.to_le_bytes()).collect();
        let per_thread = [ELEMENTS_PER_THREAD, VECTOR_ELEMENTS_PER_THREAD];
        for (n, skew) in [(MAX, 0u64), (MAX - 2, 0), (MAX, 4)] {
            let (a_at, b_at) = (put(&a_bytes, skew), put(&b_bytes, skew));
            for (out_half, per_thread) in [None, Some(GemmType::BF16)]
                .into_iter()
                .flat_map(|h| per_thread.map(|p| (h, p)))
            {
                let out: DevicePtr = device.alloc(4 * MAX + 16).unwrap() + skew;
                let vector = vector_path_applies(n, [out, a_at, b_at].into_iter());
                assert_eq!(vector, skew == 0 && n == MAX);
                let shape = [vec![1, n as u64], vec![0; MAX_RANK - 1]].concat();
                let strides = [vec![1], vec![0; MAX_RANK - 1]].concat();
                let words = [shape, strides.clone(), strides, vec![n as u64]].concat();
                let in_types = input_types_arg([Some(GemmType::BF16), None].into_iter()).unwrap();
                let args = [
                    KernelArg::Ptr(out),
                    KernelArg::Ptr(a_at),
                    KernelArg::Ptr(b_at),
                    KernelArg::Struct(words),
                    super::super::products::out_type_arg(out_half),
                    in_types,
                ];
                let config = LaunchConfig::elementwise(n.div_ceil(per_thread));
                device.launch(fused, config, &args).unwrap();
                let mut got = vec![0u8; 4 * MAX];
                device.download(out, &mut got).unwrap();
                for i in 0..MAX {
                    // Past n the (zeroed) output is not written.
                    let product = if i < n { a[i].to_f32() * b[i] } else { 0.0 };
                    let (got, want) = match out_half {
                        None => (
                            f32::from_le_bytes(got[4 * i..4 * i + 4].try_into().unwrap()),
                            product,
                        ),
                        _ => (
                            bf16::from_le_bytes([got[2 * i], got[2 * i + 1]]).to_f32(),
                            bf16::from_f32(product).to_f32(),
                        ),
                    };
                    assert_eq!(
                        got, want,
                        "n {n}, skew {skew}, {out_half:?}, {per_thread} a thread: element {i}"
                    );
                }
            }
        }
    }
}
