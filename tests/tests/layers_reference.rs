//! Every built-in layer against PyTorch / transformers reference values
//! (`tests/fixtures/reference/layers.json`, made by `gen_reference.py`): the
//! layer is built from its config, its weights are bound with
//! `load_state_dict`, and the compiled graph runs on the CPU.

use std::collections::BTreeMap;
use std::sync::Arc;

use kiln_host::compiler::compile;
use kiln_host::runtime::{
    Backend, CacheLayout, Executor, HostKvDtype, KvCache, Precision, Tensor, WeightData,
    WeightStore,
};
use kiln_plugin_api::graph::{DType, Dim, Graph, RaggedBatch, TensorType, TensorValue, WeightSpec};
use kiln_plugin_api::nn::{
    Activation, AttentionConfig, AttentionWithRope, Embedding, Layer, LayerNorm, Linear, Mlp,
    Module, RmsNorm, RopeScaling, RotaryEmbedding,
};
use kiln_plugin_api::Encoding;
use kiln_tests::reference::{compare, Fixture, FixtureTensor};
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Deserialize)]
struct Case {
    name: String,
    layer: String,
    config: Value,
    #[serde(default)]
    weights: BTreeMap<String, FixtureTensor>,
    inputs: Vec<FixtureTensor>,
    outputs: Vec<FixtureTensor>,
    atol: f64,
    rtol: f64,
}

fn u(config: &Value, key: &str) -> u64 {
    config[key]
        .as_u64()
        .unwrap_or_else(|| panic!("config {key} in {config}"))
}

fn f(config: &Value, key: &str) -> f32 {
    config[key]
        .as_f64()
        .unwrap_or_else(|| panic!("config {key} in {config}")) as f32
}

fn b(config: &Value, key: &str) -> bool {
    config[key]
        .as_bool()
        .unwrap_or_else(|| panic!("config {key} in {config}"))
}

fn activation(config: &Value) -> Activation {
    serde_json::from_value(config["activation"].clone()).expect("activation")
}

fn rotary(config: &Value) -> RotaryEmbedding {
    let mut rope = RotaryEmbedding::new(
        u(config, "head_dim"),
        config["theta"].as_f64().expect("theta"),
    );
    rope.interleaved = config
        .get("interleaved")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if let Some(scaling) = config.get("scaling") {
        rope.scaling =
            serde_json::from_value::<RopeScaling>(scaling.clone()).expect("rope scaling");
    }
    rope
}

/// The state dict and weight store of a case's weights (f32).
fn weights(case: &Case) -> (BTreeMap<String, WeightSpec>, WeightStore) {
    let mut dict = BTreeMap::new();
    let mut store = WeightStore::new();
    for (name, tensor) in &case.weights {
        let spec = WeightSpec {
            name: name.clone(),
            dtype: DType::F32,
            shape: tensor.shape.iter().map(|&d| d as u64).collect(),
            encoding: Encoding::Float32,
            device: Default::default(),
        };
        let values: Vec<f32> = tensor.values().iter().map(|&v| v as f32).collect();
        store
            .insert(WeightData::from_f32(spec.clone(), &values))
            .unwrap();
        dict.insert(name.clone(), spec);
    }
    (dict, store)
}

fn input(graph: &Graph, name: &str, t: &FixtureTensor) -> TensorValue {
    graph.input(
        name,
        TensorType::new(t.dtype(), t.shape.iter().map(|&d| d as u64)),
    )
}

/// Ragged-batch inputs for whole-sequence prefills of the given lengths.
fn batch_feeds(lengths: &[usize], block_size: usize) -> (Vec<Tensor>, usize) {
    let tokens: usize = lengths.iter().sum();
    let blocks: Vec<usize> = lengths
        .iter()
        .map(|&l| l.div_ceil(block_size).max(1))
        .collect();
    let width = *blocks.iter().max().unwrap();
    let (mut tables, mut next) = (Vec::new(), 0usize);
    for &count in &blocks {
        tables.extend((0..width).map(|i| if i < count { (next + i) as i64 } else { 0 }));
        next += count;
    }
    let positions: Vec<i64> = lengths.iter().flat_map(|&l| 0..l as i64).collect();
    let mut offsets = vec![0i64];
    for &l in lengths {
        offsets.push(offsets.last().unwrap() + l as i64);
    }
    let feeds = vec![
        Tensor::i64(vec![tokens], vec![0; tokens]),
        Tensor::i64(vec![tokens], positions),
        Tensor::i64(vec![lengths.len() + 1], offsets.clone()),
        Tensor::i64(
            vec![lengths.len()],
            lengths.iter().map(|&l| l as i64).collect(),
        ),
        Tensor::i64(vec![lengths.len(), width], tables),
        Tensor::i64(
            vec![lengths.len()],
            offsets[1..].iter().map(|o| o - 1).collect(),
        ),
    ];
    (feeds, next)
}

fn run(case: &Case) -> Result<Vec<Tensor>, String> {
    let c = &case.config;
    let graph = Graph::new(&case.name);
    let (dict, store) = weights(case);
    let mut feeds: Vec<Tensor> = case.inputs.iter().map(FixtureTensor::to_tensor).collect();
    let mut cache = None;
    let load = |module: &dyn Module| module.load_state_dict(&dict).map_err(|e| e.to_string());
    let output = match case.layer.as_str() {
        "linear" => {
            let layer = Linear::new(u(c, "in_dim"), u(c, "out_dim"), DType::F32, b(c, "bias"));
            load(&layer)?;
            layer.forward(&input(&graph, "x", &case.inputs[0]))
        }
        "embedding" => {
            let layer = Embedding::new(u(c, "vocab"), u(c, "dim"), DType::F32);
            load(&layer)?;
            layer.forward(&input(&graph, "ids", &case.inputs[0]))
        }
        "rms_norm" => {
            let layer = RmsNorm::new(u(c, "dim"), DType::F32, f(c, "eps"))
                .with_weight_offset(f(c, "weight_offset"));
            load(&layer)?;
            layer.forward(&input(&graph, "x", &case.inputs[0]))
        }
        "layer_norm" => {
            let layer = LayerNorm::new(u(c, "dim"), DType::F32, f(c, "eps"), b(c, "bias"));
            load(&layer)?;
            layer.forward(&input(&graph, "x", &case.inputs[0]))
        }
        "mlp" => {
            let (dim, hidden) = (u(c, "dim"), u(c, "hidden"));
            let layer = if b(c, "gated") {
                Mlp::gated(dim, hidden, DType::F32, activation(c))
            } else {
                Mlp::plain(dim, hidden, DType::F32, activation(c), b(c, "bias"))
            };
            load(&layer)?;
            layer.forward(&input(&graph, "x", &case.inputs[0]))
        }
        "rotary" => {
            let x = input(&graph, "x", &case.inputs[0]);
            let positions = input(&graph, "positions", &case.inputs[1]);
            rotary(c).forward(&x, &positions)
        }
        "attention" => {
            let config = AttentionConfig {
                hidden_size: u(c, "hidden_size"),
                num_heads: u(c, "num_heads"),
                num_kv_heads: u(c, "num_kv_heads"),
                head_dim: u(c, "head_dim"),
                qkv_bias: b(c, "qkv_bias"),
                o_bias: false,
                qk_norm_eps: c["qk_norm_eps"].as_f64().map(|e| e as f32),
                scale: None,
                sliding_window: c["sliding_window"].as_u64().map(|w| w as u32),
                softcap: c["softcap"].as_f64().map(|s| s as f32),
                dtype: DType::F32,
            };
            let layout = CacheLayout {
                block_size: u(c, "block_size") as usize,
                num_kv_heads: config.num_kv_heads as usize,
                head_dim: config.head_dim as usize,
            };
            let layer = AttentionWithRope::new(config, rotary(c), 0);
            load(&layer)?;
            // The token axis is the batch's symbolic `T`.
            let hidden = case.inputs[0].shape[1] as u64;
            let x = graph.input(
                "x",
                TensorType::new(DType::F32, [Dim::sym("T"), Dim::Static(hidden)]),
            );
            let batch = RaggedBatch::inputs(&graph);
            let offsets: Vec<usize> = c["row_offsets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            let lengths: Vec<usize> = offsets.windows(2).map(|w| w[1] - w[0]).collect();
            let (extra, blocks) = batch_feeds(&lengths, layout.block_size);
            feeds.extend(extra);
            cache = Some(KvCache::new(1, blocks, layout, HostKvDtype::F32));
            layer.forward(&x, &batch)
        }
        other => panic!("case {} uses unknown layer {other}", case.name),
    };
    graph.output(&[&output]);
    let ir = graph.build().map_err(|e| format!("graph: {e}"))?;
    let program = compile(&ir).map_err(|e| format!("compile: {e}"))?;
    let executor =
        Executor::new(Arc::new(program), &store, Precision::Exact).map_err(|e| e.to_string())?;
    executor
        .run(feeds, cache.as_mut())
        .map_err(|e| format!("run: {e}"))
}

#[test]
fn every_layer_matches_pytorch() {
    let path = kiln_tests::workspace_root().join("tests/fixtures/reference/layers.json");
    let fixture: Fixture<Case> =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut failures = Vec::new();
    let mut layers = std::collections::BTreeSet::new();
    for case in &fixture.cases {
        layers.insert(case.layer.as_str());
        match run(case) {
            Err(e) => failures.push(format!("{}: {e}", case.name)),
            Ok(outputs) => {
                if let Err(e) = compare(&outputs[0], &case.outputs[0], case.atol, case.rtol) {
                    failures.push(format!("{}: {e}", case.name));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases disagree with torch {}:\n{}",
        failures.len(),
        fixture.cases.len(),
        fixture.torch,
        failures.join("\n")
    );
    let required = [
        "linear",
        "embedding",
        "rms_norm",
        "layer_norm",
        "mlp",
        "rotary",
        "attention",
    ];
    let missing: Vec<_> = required.iter().filter(|l| !layers.contains(*l)).collect();
    assert!(
        missing.is_empty(),
        "layers without reference cases: {missing:?}"
    );
}
