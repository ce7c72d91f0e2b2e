//! Every graph op against PyTorch reference values
//! (`tests/fixtures/reference/ops.json`, made by `gen_reference.py`).
//!
//! Each case runs three times: with its operands as graph inputs (the CPU
//! runtime's kernels), as constants (the compiler's constant folding), and
//! as inputs on the CUDA backend (the kernel emulator, or a GPU with
//! KILN_TEST_CUDA_DEVICE), where an op without a CUDA kernel must be refused
//! at load, naming it.

use std::sync::Arc;

use kiln_host::compiler::compile;
use kiln_host::runtime::cuda::{CudaExecutor, CudaOptions, WeightDtype};
use kiln_host::runtime::{
    Backend, CacheLayout, Executor, HostKvDtype, KvCache, Precision, Tensor, WeightStore,
};
use kiln_plugin_api::graph::{
    ops, AttentionSpec, DType, Graph, RaggedBatch, TensorType, TensorValue,
};
use kiln_tests::reference::{compare, Fixture, FixtureTensor};
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Deserialize)]
struct Case {
    name: String,
    op: String,
    #[serde(default)]
    attrs: Value,
    inputs: Vec<FixtureTensor>,
    outputs: Vec<FixtureTensor>,
    atol: f64,
    rtol: f64,
}

fn fixture() -> Fixture<Case> {
    let path = kiln_tests::workspace_root().join("tests/fixtures/reference/ops.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn int(attrs: &Value, key: &str) -> i64 {
    attrs[key]
        .as_i64()
        .unwrap_or_else(|| panic!("attr {key} in {attrs}"))
}

fn float(attrs: &Value, key: &str) -> f64 {
    attrs[key]
        .as_f64()
        .unwrap_or_else(|| panic!("attr {key} in {attrs}"))
}

fn dtype(attrs: &Value, key: &str) -> DType {
    serde_json::from_value(attrs[key].clone()).unwrap_or_else(|_| panic!("attr {key} in {attrs}"))
}

fn ints(attrs: &Value, key: &str) -> Vec<i64> {
    attrs[key]
        .as_array()
        .unwrap_or_else(|| panic!("attr {key} in {attrs}"))
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect()
}

/// Records the case's op on `args`; `batch` is set for paged attention.
fn apply(
    case: &Case,
    graph: &Graph,
    args: &[TensorValue],
    batch: Option<&RaggedBatch>,
) -> Vec<TensorValue> {
    let a = &case.attrs;
    let x = || &args[0];
    let refs: Vec<&TensorValue> = args.iter().collect();
    let one = |v: TensorValue| vec![v];
    match case.op.as_str() {
        "neg" => one(ops::neg(x())),
        "abs" => one(ops::abs(x())),
        "exp" => one(ops::exp(x())),
        "log" => one(ops::log(x())),
        "sqrt" => one(ops::sqrt(x())),
        "rsqrt" => one(ops::rsqrt(x())),
        "reciprocal" => one(ops::reciprocal(x())),
        "square" => one(ops::square(x())),
        "sin" => one(ops::sin(x())),
        "cos" => one(ops::cos(x())),
        "tanh" => one(ops::tanh(x())),
        "sigmoid" => one(ops::sigmoid(x())),
        "relu" => one(ops::relu(x())),
        "silu" => one(ops::silu(x())),
        "gelu" => one(ops::gelu(x())),
        "gelu_tanh" => one(ops::gelu_tanh(x())),
        "floor" => one(ops::floor(x())),
        "ceil" => one(ops::ceil(x())),
        "logical_not" => one(ops::logical_not(x())),
        "add" => one(ops::add(&args[0], &args[1])),
        "sub" => one(ops::sub(&args[0], &args[1])),
        "mul" => one(ops::mul(&args[0], &args[1])),
        "div" => one(ops::div(&args[0], &args[1])),
        "pow" => one(ops::pow(&args[0], &args[1])),
        "maximum" => one(ops::maximum(&args[0], &args[1])),
        "minimum" => one(ops::minimum(&args[0], &args[1])),
        "equal" => one(ops::equal(&args[0], &args[1])),
        "not_equal" => one(ops::not_equal(&args[0], &args[1])),
        "greater" => one(ops::greater(&args[0], &args[1])),
        "greater_equal" => one(ops::greater_equal(&args[0], &args[1])),
        "less" => one(ops::less(&args[0], &args[1])),
        "less_equal" => one(ops::less_equal(&args[0], &args[1])),
        "logical_and" => one(ops::logical_and(&args[0], &args[1])),
        "logical_or" => one(ops::logical_or(&args[0], &args[1])),
        "where" => one(ops::where_(&args[0], &args[1], &args[2])),
        "cast" => one(ops::cast(x(), dtype(a, "dtype"))),
        "sum" => one(ops::sum(
            x(),
            int(a, "axis"),
            a["keep_dims"].as_bool().unwrap(),
        )),
        "mean" => one(ops::mean(
            x(),
            int(a, "axis"),
            a["keep_dims"].as_bool().unwrap(),
        )),
        "max" => one(ops::max(
            x(),
            int(a, "axis"),
            a["keep_dims"].as_bool().unwrap(),
        )),
        "min" => one(ops::min(
            x(),
            int(a, "axis"),
            a["keep_dims"].as_bool().unwrap(),
        )),
        "argmax" => one(ops::argmax(
            x(),
            int(a, "axis"),
            a["keep_dims"].as_bool().unwrap(),
        )),
        "top_k" => {
            let (values, indices) = ops::top_k(x(), int(a, "k") as u64);
            vec![values, indices]
        }
        "softmax" => one(ops::softmax(x(), int(a, "axis"))),
        "log_softmax" => one(ops::log_softmax(x(), int(a, "axis"))),
        "matmul" => one(ops::matmul(&args[0], &args[1])),
        "reshape" => one(ops::reshape(x(), ints(a, "shape"))),
        "transpose" => one(ops::transpose(x(), int(a, "a"), int(a, "b"))),
        "permute" => one(ops::permute(x(), &ints(a, "perm"))),
        "squeeze" => one(ops::squeeze(x(), int(a, "axis"))),
        "unsqueeze" => one(ops::unsqueeze(x(), int(a, "axis"))),
        "concat" => one(ops::concat(&refs, int(a, "axis"))),
        "stack" => one(ops::stack(&refs, int(a, "axis"))),
        "split" => {
            let sizes: Vec<u64> = ints(a, "sizes").iter().map(|&s| s as u64).collect();
            ops::split(x(), &sizes, int(a, "axis"))
        }
        "slice" => one(ops::slice(
            x(),
            int(a, "axis"),
            int(a, "start"),
            a["end"].as_i64(),
            int(a, "step") as u64,
        )),
        "broadcast_to" => one(ops::broadcast_to(
            x(),
            ints(a, "shape").iter().map(|&d| d as u64),
        )),
        "gather" => one(ops::gather(&args[0], &args[1], int(a, "axis"))),
        "scatter" => one(ops::scatter(&args[0], &args[1], &args[2], int(a, "axis"))),
        "band_part" => one(ops::band_part(
            x(),
            int(a, "num_lower"),
            int(a, "num_upper"),
            a["exclude"].as_bool().unwrap(),
        )),
        "range" => one(graph.range(
            float(a, "start"),
            float(a, "step"),
            int(a, "len") as u64,
            dtype(a, "dtype"),
        )),
        "layer_norm" => one(ops::layer_norm(
            &args[0],
            &args[1],
            &args[2],
            float(a, "eps") as f32,
        )),
        "rms_norm" => one(ops::rms_norm(
            &args[0],
            &args[1],
            float(a, "eps") as f32,
            float(a, "weight_offset") as f32,
        )),
        "rope" => one(ops::rope(
            &args[0],
            &args[1],
            &args[2],
            a["interleaved"].as_bool().unwrap(),
            float(a, "scale") as f32,
        )),
        "paged_attention" => {
            let spec = AttentionSpec {
                layer: 0,
                scale: float(a, "scale") as f32,
                sliding_window: a["sliding_window"].as_u64().map(|w| w as u32),
                softcap: a["softcap"].as_f64().map(|c| c as f32),
            };
            one(ops::paged_attention(
                &args[0],
                &args[1],
                &args[2],
                batch.expect("attention cases have a batch"),
                spec,
            ))
        }
        other => panic!("case {} uses unknown op {other}", case.name),
    }
}

/// The extra inputs and the cache for an attention case: each sequence gets
/// its own consecutive blocks.
fn attention_setup(case: &Case) -> (Vec<Tensor>, KvCache) {
    let block_size = int(&case.attrs, "block_size") as usize;
    let row_offsets: Vec<i64> = case.inputs[3].values().iter().map(|&v| v as i64).collect();
    let context_lens: Vec<i64> = case.inputs[4].values().iter().map(|&v| v as i64).collect();
    let blocks: Vec<usize> = context_lens
        .iter()
        .map(|&c| (c as usize).div_ceil(block_size).max(1))
        .collect();
    let width = *blocks.iter().max().unwrap();
    let mut tables = Vec::new();
    let mut next = 0i64;
    for &b in &blocks {
        tables.extend((0..width).map(|i| if i < b { next + i as i64 } else { 0 }));
        next += b as i64;
    }
    let k = &case.inputs[1];
    let layout = CacheLayout {
        block_size,
        num_kv_heads: k.shape[1],
        head_dim: k.shape[2],
    };
    let tokens = case.inputs[0].shape[0];
    let batch = context_lens.len();
    let extra = vec![
        Tensor::i64(vec![tokens], vec![0; tokens]),
        Tensor::i64(vec![tokens], vec![0; tokens]),
        Tensor::i64(vec![batch + 1], row_offsets),
        Tensor::i64(vec![batch], context_lens),
        Tensor::i64(vec![batch, width], tables),
        Tensor::i64(vec![batch], vec![0; batch]),
    ];
    (
        extra,
        KvCache::new(1, next as usize, layout, HostKvDtype::F32),
    )
}

/// How a case runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Operands as inputs, on the CPU.
    Runtime,
    /// Operands as constants: the compiler folds them.
    Folded,
    /// Operands as inputs, on the CUDA backend.
    Cuda,
}

/// Ops the CUDA backend has no kernel for yet (no built-in architecture
/// uses them); their graphs are refused at load.
const NOT_ON_CUDA: [&str; 8] = [
    "argmax",
    "band_part",
    "max",
    "mean",
    "min",
    "scatter",
    "sum",
    "top_k",
];

/// Runs one case in `mode`.
fn run(case: &Case, mode: Mode) -> Result<Vec<Tensor>, String> {
    let as_constants = mode == Mode::Folded;
    let graph = Graph::new(&case.name);
    let attention = case.op == "paged_attention";
    let operands = if attention {
        &case.inputs[..3]
    } else {
        &case.inputs[..]
    };
    let mut feeds = Vec::new();
    let args: Vec<TensorValue> = operands
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if as_constants && !attention {
                graph.constant(
                    t.values(),
                    t.dtype(),
                    &t.shape.iter().map(|&d| d as u64).collect::<Vec<_>>(),
                )
            } else {
                feeds.push(t.to_tensor());
                graph.input(
                    format!("arg{i}"),
                    TensorType::new(t.dtype(), t.shape.iter().map(|&d| d as u64)),
                )
            }
        })
        .collect();
    let (batch, mut cache) = if attention {
        let (extra, cache) = attention_setup(case);
        feeds.extend(extra);
        (Some(RaggedBatch::inputs(&graph)), Some(cache))
    } else {
        (None, None)
    };
    let outputs = apply(case, &graph, &args, batch.as_ref());
    graph.output(&outputs.iter().collect::<Vec<_>>());
    let ir = graph.build().map_err(|e| format!("graph: {e}"))?;
    let program = Arc::new(compile(&ir).map_err(|e| format!("compile: {e}"))?);
    let backend: Box<dyn Backend> = match mode {
        Mode::Cuda => {
            let device = kiln_host::device::open(
                kiln_tests::models::cuda_test_device(),
                std::env::temp_dir().join("kiln-kernels"),
            )
            .map_err(|e| e.to_string())?
            .expect("a CUDA device");
            let options = CudaOptions {
                dtype: WeightDtype::Float32,
                graphs: false,
                ..CudaOptions::default()
            };
            Box::new(
                CudaExecutor::new(program, &WeightStore::new(), device, "cuda".into(), options)
                    .map_err(|e| format!("load: {e}"))?,
            )
        }
        _ => Box::new(
            Executor::new(program, &WeightStore::new(), Precision::Exact)
                .map_err(|e| e.to_string())?,
        ),
    };
    let mut cache = match cache.take() {
        Some(host) => Some(
            backend
                .new_kv_cache(host.num_layers(), host.num_blocks(), host.layout())
                .map_err(|e| e.to_string())?,
        ),
        None => None,
    };
    backend
        .run(feeds, cache.as_mut())
        .map_err(|e| format!("run: {e}"))
}

#[test]
fn every_op_matches_pytorch() {
    let fixture = fixture();
    let mut failures = Vec::new();
    let mut refused = std::collections::BTreeSet::new();
    for case in &fixture.cases {
        for mode in [Mode::Runtime, Mode::Folded, Mode::Cuda] {
            match run(case, mode) {
                Err(e)
                    if mode == Mode::Cuda
                        && NOT_ON_CUDA.contains(&case.op.as_str())
                        && e.starts_with("load: ")
                        && e.contains("(CUDA backend)") =>
                {
                    refused.insert(case.op.as_str());
                }
                Err(e) => failures.push(format!("{} ({mode:?}): {e}", case.name)),
                Ok(outputs) => {
                    for (i, (actual, expected)) in outputs.iter().zip(&case.outputs).enumerate() {
                        if let Err(e) = compare(actual, expected, case.atol, case.rtol) {
                            failures.push(format!("{} ({mode:?}) output {i}: {e}", case.name));
                        }
                    }
                }
            }
        }
    }
    // Each op listed as missing on CUDA is really refused (the list is not stale).
    assert_eq!(refused.into_iter().collect::<Vec<_>>(), NOT_ON_CUDA);
    assert!(
        failures.is_empty(),
        "{} of {} cases disagree with torch {}:\n{}",
        failures.len(),
        fixture.cases.len(),
        fixture.torch,
        failures.join("\n")
    );
}

#[test]
fn the_fixture_covers_every_op() {
    let fixture = fixture();
    let covered: std::collections::BTreeSet<&str> =
        fixture.cases.iter().map(|c| c.op.as_str()).collect();
    let required = [
        "neg",
        "abs",
        "exp",
        "log",
        "sqrt",
        "rsqrt",
        "reciprocal",
        "square",
        "sin",
        "cos",
        "tanh",
        "sigmoid",
        "relu",
        "silu",
        "gelu",
        "gelu_tanh",
        "floor",
        "ceil",
        "logical_not",
        "add",
        "sub",
        "mul",
        "div",
        "pow",
        "maximum",
        "minimum",
        "equal",
        "not_equal",
        "greater",
        "greater_equal",
        "less",
        "less_equal",
        "logical_and",
        "logical_or",
        "where",
        "cast",
        "sum",
        "mean",
        "max",
        "min",
        "argmax",
        "top_k",
        "softmax",
        "log_softmax",
        "matmul",
        "reshape",
        "transpose",
        "permute",
        "squeeze",
        "unsqueeze",
        "concat",
        "stack",
        "split",
        "slice",
        "broadcast_to",
        "gather",
        "scatter",
        "band_part",
        "range",
        "layer_norm",
        "rms_norm",
        "rope",
        "paged_attention",
    ];
    let missing: Vec<&str> = required
        .iter()
        .copied()
        .filter(|op| !covered.contains(op))
        .collect();
    assert!(
        missing.is_empty(),
        "ops without reference cases: {missing:?}"
    );
}
