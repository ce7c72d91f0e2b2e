//! Building graphs and modules: construction errors name the op and module,
//! shapes are inferred (symbolic ones included), and state dicts load by
//! fully qualified names.

use kiln_plugin_api::graph::ops::ReshapeDim;
use kiln_plugin_api::graph::{ops, DType, Dim, Graph, GraphIr, Op, TensorType};
use kiln_plugin_api::nn::{
    Activation, Layer, Linear, Mlp, Module, Registry, RopeScaling, RotaryEmbedding, Sequential,
    StateDict, Weight,
};
use kiln_plugin_api::Encoding;

fn f32_input(graph: &Graph, name: &str, shape: &[Dim]) -> kiln_plugin_api::graph::TensorValue {
    graph.input(name, TensorType::new(DType::F32, shape.iter().cloned()))
}

#[test]
fn shape_errors_name_the_op_and_module_and_do_not_cascade() {
    let graph = Graph::new("bad");
    let a = f32_input(&graph, "a", &[Dim::Static(4), Dim::Static(8)]);
    let b = f32_input(&graph, "b", &[Dim::Static(7), Dim::Static(3)]);
    let product = {
        let _scope = graph.scope("layers.0.mlp");
        ops::matmul(&a, &b)
    };
    // Later ops on the poisoned value add no second error.
    let later = ops::relu(&(&product + 1.0));
    graph.output(&[&later]);
    let error = graph.build().unwrap_err();
    assert_eq!(error.op, "matmul");
    assert_eq!(error.module, "layers.0.mlp");
    assert_eq!(
        error.to_string(),
        "`matmul` in module `layers.0.mlp`: inner dimensions differ: f32[4, 8] × f32[7, 3]"
    );
}

#[test]
fn other_construction_errors_are_reported() {
    type Build = Box<dyn Fn(&Graph)>;
    let cases: Vec<(&str, Build)> = vec![
        (
            "axis 3 is out of range for rank 2",
            Box::new(|g| {
                let x = f32_input(g, "x", &[Dim::Static(2), Dim::Static(3)]);
                g.output(&[&ops::softmax(&x, 3)]);
            }),
        ),
        (
            "operand types differ: f32 and i64",
            Box::new(|g| {
                let x = f32_input(g, "x", &[Dim::Static(2)]);
                let y = g.input("y", TensorType::new(DType::I64, [2u64]));
                g.output(&[&(&x + &y)]);
            }),
        ),
        (
            "cannot reshape f32[2, 3] to [4, 2]",
            Box::new(|g| {
                let x = f32_input(g, "x", &[Dim::Static(2), Dim::Static(3)]);
                g.output(&[&ops::reshape(&x, [4, 2])]);
            }),
        ),
        (
            "shapes [T, 4] and [3] do not broadcast",
            Box::new(|g| {
                let x = f32_input(g, "x", &[Dim::sym("T"), Dim::Static(4)]);
                let y = f32_input(g, "y", &[Dim::Static(3)]);
                g.output(&[&(&x * &y)]);
            }),
        ),
        (
            "the graph has no outputs",
            Box::new(|g| {
                f32_input(g, "x", &[Dim::Static(1)]);
            }),
        ),
        (
            "two different weights are named `w`",
            Box::new(|g| {
                let a = Weight::new("w", DType::F32, &[2]);
                let b = Weight::new("w", DType::F32, &[3]);
                g.output(&[&a.value(g), &b.value(g)]);
            }),
        ),
        (
            "an operand belongs to another graph",
            Box::new(|g| {
                let other = Graph::new("other");
                let x = f32_input(&other, "x", &[Dim::Static(2)]);
                let y = f32_input(g, "y", &[Dim::Static(2)]);
                g.output(&[&(&y + &x)]);
            }),
        ),
    ];
    for (expected, build) in cases {
        let graph = Graph::new("case");
        build(&graph);
        let error = graph.build().unwrap_err().to_string();
        assert!(
            error.contains(expected),
            "expected {expected:?} in {error:?}"
        );
    }
}

#[test]
fn reshape_infers_static_and_symbolic_dimensions() {
    let graph = Graph::new("reshape");
    let x = f32_input(&graph, "x", &[Dim::sym("T"), Dim::Static(12)]);
    let heads = ops::reshape(&x, [-1, 3, 4]);
    assert_eq!(
        heads.shape(),
        &[Dim::sym("T"), Dim::Static(3), Dim::Static(4)]
    );
    let flat = ops::reshape(&heads, [ReshapeDim::from(Dim::sym("T")), ReshapeDim::Infer]);
    assert_eq!(flat.shape(), &[Dim::sym("T"), Dim::Static(12)]);
    let y = f32_input(&graph, "y", &[Dim::Static(2), Dim::Static(6)]);
    assert_eq!(
        ops::reshape(&y, [3, -1]).shape(),
        &[Dim::Static(3), Dim::Static(4)]
    );
    graph.output(&[&flat]);
    graph.build().unwrap();
}

#[test]
fn graphs_serialize_print_and_reject_future_versions() {
    let graph = Graph::new("tiny");
    let x = f32_input(&graph, "x", &[Dim::sym("T"), Dim::Static(4)]);
    let y = {
        let _scope = graph.scope("block");
        ops::print(&ops::silu(&x), "after silu")
    };
    graph.output(&[&y]);
    let ir = graph.build().unwrap();
    let bytes = ir.to_bytes();
    assert_eq!(GraphIr::from_bytes(&bytes).unwrap(), ir);
    let text = ir.to_string();
    assert!(text.contains("%0 = input \"x\" : f32[T, 4]"), "{text}");
    assert!(
        text.contains("%1 = silu(%0) : f32[T, 4]  # block"),
        "{text}"
    );
    assert!(
        text.contains("%2 = print(%1) {label=\"after silu\"}"),
        "{text}"
    );

    let mut future: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    future["version"] = 99.into();
    let error = GraphIr::from_bytes(&serde_json::to_vec(&future).unwrap()).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("graph IR version 99 is not supported"),
        "{error}"
    );
}

struct Block {
    fc1: Linear,
    fc2: Linear,
    scale: Weight,
}

impl Module for Block {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.module("fc1", &self.fc1);
        registry.module("fc2", &self.fc2);
        registry.weight("scale", &self.scale);
    }
}

struct Model {
    layers: Vec<Block>,
}

impl Module for Model {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.list("layers", &self.layers);
    }
}

fn model() -> Model {
    let block = || Block {
        fc1: Linear::new(4, 8, DType::F32, false),
        fc2: Linear::new(8, 4, DType::F32, true),
        scale: Weight::new("scale", DType::F32, &[4]),
    };
    Model {
        layers: vec![block(), block()],
    }
}

#[test]
fn module_names_are_fully_qualified_and_never_collide() {
    let model = model();
    let names: Vec<String> = model.raw_state_dict().into_keys().collect();
    assert_eq!(
        names,
        [
            "layers.0.fc1.weight",
            "layers.0.fc2.bias",
            "layers.0.fc2.weight",
            "layers.0.scale",
            "layers.1.fc1.weight",
            "layers.1.fc2.bias",
            "layers.1.fc2.weight",
            "layers.1.scale",
        ]
    );
    // Every weight is a distinct graph weight.
    let graph = Graph::new("names");
    let x = f32_input(&graph, "x", &[Dim::Static(1), Dim::Static(4)]);
    let mut h = x;
    for block in &model.layers {
        h = &block.fc2.forward(&block.fc1.forward(&h)) * &block.scale.value(&graph);
    }
    graph.output(&[&h]);
    assert_eq!(graph.build().unwrap().weights.len(), 8);
}

#[test]
fn load_state_dict_reports_every_problem_in_one_error() {
    let model = model();
    let mut state: StateDict = model.raw_state_dict();
    state.remove("layers.0.fc1.weight"); // missing
    state.get_mut("layers.0.fc2.weight").unwrap().shape = vec![4, 9]; // mis-shaped
    state.get_mut("layers.1.scale").unwrap().dtype = DType::I64; // mis-typed
    let mut extra = state["layers.0.scale"].clone();
    extra.name = "layers.0.extra".into();
    state.insert(extra.name.clone(), extra); // unexpected
    let error = model.load_state_dict(&state).unwrap_err().to_string();
    for expected in [
        "4 problem(s)",
        "missing `layers.0.fc1.weight` (f32 [8, 4])",
        "`layers.0.fc2.weight` has shape [4, 9], the module expects [4, 8]",
        "`layers.1.scale` is i64, the module expects f32",
        "unexpected `layers.0.extra`",
    ] {
        assert!(
            error.contains(expected),
            "expected {expected:?} in:\n{error}"
        );
    }
    assert!(
        model.state_dict().len() < 8,
        "failed loads do not bind everything"
    );
}

#[test]
fn load_state_dict_lists_a_few_problems_and_counts_the_rest() {
    let model = model();
    let error = model
        .load_state_dict(&StateDict::new())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("8 problem(s)") && error.contains("and 4 more") && !error.contains('\n'),
        "{error}"
    );
}

#[test]
fn other_float_widths_load_as_storage_encodings() {
    let model = model();
    let mut state = model.raw_state_dict();
    for spec in state.values_mut() {
        spec.dtype = DType::BF16;
        spec.encoding = Encoding::BFloat16;
    }
    model.load_state_dict(&state).unwrap();
    let loaded = &model.state_dict()["layers.0.scale"];
    assert_eq!(
        (loaded.dtype, loaded.encoding),
        (DType::F32, Encoding::BFloat16)
    );
}

#[test]
fn quantized_checkpoints_load_into_quantizable_weights_only() {
    let model = model();
    let mut state = model.raw_state_dict();
    state.get_mut("layers.0.fc1.weight").unwrap().encoding = Encoding::Q4_0;
    model.load_state_dict(&state).unwrap();
    assert_eq!(
        model.state_dict()["layers.0.fc1.weight"].encoding,
        Encoding::Q4_0
    );
    assert_eq!(model.state_dict().len(), 8);

    state.get_mut("layers.0.scale").unwrap().encoding = Encoding::Q8_0;
    let error = model.load_state_dict(&state).unwrap_err().to_string();
    assert!(
        error.contains("`layers.0.scale` is quantized (q8_0), the module expects f32"),
        "{error}"
    );
}

#[test]
fn sequential_chains_layers_and_names_them_by_position() {
    let layers = Sequential::new(vec![
        Box::new(Linear::new(4, 8, DType::F32, false)),
        Box::new(Mlp::gated(8, 16, DType::F32, Activation::Silu)),
    ]);
    let names: Vec<String> = layers.raw_state_dict().into_keys().collect();
    assert_eq!(
        names,
        [
            "0.weight",
            "1.down_proj.weight",
            "1.gate_proj.weight",
            "1.up_proj.weight"
        ]
    );
    let graph = Graph::new("seq");
    let x = f32_input(&graph, "x", &[Dim::sym("T"), Dim::Static(4)]);
    let y = layers.forward(&x);
    assert_eq!(y.shape(), &[Dim::sym("T"), Dim::Static(8)]);
    graph.output(&[&y]);
    let ir = graph.build().unwrap();
    assert_eq!(
        ir.nodes
            .iter()
            .filter(|n| matches!(n.op, Op::MatMul))
            .count(),
        4
    );
}

/// Per-frequency rope factors (GGUF's `rope_freqs.weight`) divide the
/// inverse frequencies; a count other than `head_dim / 2` is a build error.
#[test]
fn rope_frequency_factors_must_match_the_head_dim() {
    let mut rope = RotaryEmbedding::new(8, 10_000.0);
    rope.scaling = RopeScaling::FreqFactors {
        factors: vec![1.0, 2.0, 4.0, 8.0],
    };
    let scaled = rope.inv_freq();
    let plain = RotaryEmbedding::new(8, 10_000.0).inv_freq();
    for (i, divisor) in [1.0, 2.0, 4.0, 8.0].into_iter().enumerate() {
        assert_eq!(scaled[i], plain[i] / divisor);
    }
    for count in [3, 5] {
        rope.scaling = RopeScaling::FreqFactors {
            factors: vec![1.0; count],
        };
        let graph = Graph::new("rope");
        let x = f32_input(
            &graph,
            "x",
            &[Dim::Static(2), Dim::Static(1), Dim::Static(8)],
        );
        let positions = graph.input("positions", TensorType::new(DType::I64, [Dim::Static(2)]));
        let out = rope.forward(&x, &positions);
        graph.output(&[&out]);
        let error = graph.build().unwrap_err().to_string();
        assert!(
            error.contains("inv_freq f32[4]"),
            "{count} factors: {error}"
        );
    }
}
