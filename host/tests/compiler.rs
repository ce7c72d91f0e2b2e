//! The compiler's passes, its errors, the compile cache, and weights in
//! stored encodings through the runtime.

use std::sync::Arc;

use kiln_host::compiler::{compile, CompileCache, CompileOutcome, Kernel};
use kiln_host::runtime::{Backend, Executor, Precision, Tensor, WeightData, WeightStore};
use kiln_kernels::quant::{dequantize_row, quantize_row, QuantType};
use kiln_plugin_api::graph::{ops, DType, Device, Dim, Graph, GraphIr, TensorType, WeightSpec};
use kiln_plugin_api::nn::{Embedding, Layer, Linear, Module};
use kiln_plugin_api::Encoding;

fn run(ir: &GraphIr, store: &WeightStore, inputs: Vec<Tensor>) -> Vec<Tensor> {
    let program = compile(ir).unwrap();
    Executor::new(Arc::new(program), store, Precision::Exact)
        .unwrap()
        .run(inputs, None)
        .unwrap()
}

/// `silu(x) * 2 + (x*3 - x*3)` plus a dead branch and a constant subgraph.
fn redundant_graph() -> GraphIr {
    let graph = Graph::new("redundant");
    let x = graph.input(
        "x",
        TensorType::new(DType::F32, [Dim::sym("T"), Dim::Static(4)]),
    );
    let _dead = ops::exp(&x);
    let twice = &graph.scalar(1.0, DType::F32) + &graph.scalar(1.0, DType::F32); // folds to 2
    let a = &x * 3.0;
    let b = &x * 3.0; // same as `a`
    let y = &(&ops::silu(&x) * &twice) + &(&a - &b);
    graph.output(&[&y]);
    graph.build().unwrap()
}

#[test]
fn passes_remove_dead_code_merge_duplicates_fold_constants_and_fuse() {
    let ir = redundant_graph();
    let program = compile(&ir).unwrap();
    let report = &program.report;
    assert!(report.dead_removed >= 1, "{report:?}");
    assert!(
        report.cse_merged >= 2,
        "the second `* 3.0` and its constant: {report:?}"
    );
    assert_eq!(report.folded, 1, "{report:?}");
    // silu, mul, mul, sub, add: one fused kernel.
    assert_eq!(report.fused_kernels, 1, "{report:?}");
    assert_eq!(program.steps.len(), 1, "{:#?}", program.steps);
    assert!(matches!(program.steps[0].kernel, Kernel::Fused { .. }));

    let x: Vec<f32> = vec![-2.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0, -3.0];
    let out = run(
        &ir,
        &WeightStore::new(),
        vec![Tensor::f32(vec![2, 4], x.clone())],
    );
    let expected: Vec<f32> = x.iter().map(|v| v / (1.0 + (-v).exp()) * 2.0).collect();
    assert_eq!(out[0].shape, [2, 4]);
    for (a, e) in out[0].as_f32().iter().zip(&expected) {
        assert!((a - e).abs() < 1e-6, "{a} vs {e}");
    }
}

#[test]
fn liveness_frees_values_after_their_last_step() {
    let graph = Graph::new("chain");
    let x = graph.input("x", TensorType::new(DType::F32, [8u64, 8]));
    let y = ops::softmax(&ops::matmul(&x, &x), -1);
    let z = ops::matmul(&y, &x);
    graph.output(&[&z]);
    let program = compile(&graph.build().unwrap()).unwrap();
    // matmul, softmax, matmul: the first product dies at the softmax (step 1),
    // the input is read last by step 2, the output is never freed.
    assert_eq!(program.steps.len(), 3);
    let first = program.steps[0].output as usize;
    assert_eq!(program.last_use[first], Some(1));
    assert_eq!(program.last_use[0], Some(2));
    assert_eq!(program.last_use[program.steps[2].output as usize], None);
}

#[test]
fn verification_names_the_op_and_module() {
    let graph = Graph::new("tampered");
    let x = graph.input("x", TensorType::new(DType::F32, [2u64, 3]));
    let y = {
        let _scope = graph.scope("layers.1.mlp");
        ops::relu(&x)
    };
    graph.output(&[&y]);
    let mut ir = graph.build().unwrap();
    ir.nodes[1].ty = TensorType::new(DType::F32, [3u64, 2]);
    let error = compile(&ir).unwrap_err().to_string();
    assert_eq!(
        error,
        "invalid graph: `%1 = relu` in module `layers.1.mlp`: declared type f32[3, 2] but the operands give f32[2, 3]"
    );

    let mut ir = graph.build().unwrap();
    ir.nodes[1].inputs = vec![5];
    assert!(compile(&ir)
        .unwrap_err()
        .to_string()
        .contains("operand %5 is not defined before %1"));
}

#[test]
fn the_compile_cache_skips_compilation_the_second_time() {
    let dir = tempfile::tempdir().unwrap();
    let cache = CompileCache::in_dir(dir.path());
    let ir = redundant_graph();
    let (first, outcome) = cache.get_or_compile(&ir, Device::Cpu).unwrap();
    assert!(
        matches!(outcome, CompileOutcome::Compiled(_)),
        "{outcome:?}"
    );
    let (second, outcome) = cache.get_or_compile(&ir, Device::Cpu).unwrap();
    assert!(matches!(outcome, CompileOutcome::Cached(_)), "{outcome:?}");
    assert_eq!(first, second);
    // Another device or graph is another entry.
    assert_ne!(
        CompileCache::key(&ir, Device::Cpu),
        CompileCache::key(&ir, Device::Gpu(0))
    );

    // A corrupt entry is ignored and rewritten.
    let entry = std::fs::read_dir(dir.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::write(&entry, b"{ not json").unwrap();
    let (third, outcome) = cache.get_or_compile(&ir, Device::Cpu).unwrap();
    assert!(matches!(outcome, CompileOutcome::Compiled(_)));
    assert_eq!(third, first);
    assert!(matches!(
        cache.get_or_compile(&ir, Device::Cpu).unwrap().1,
        CompileOutcome::Cached(_)
    ));
}

fn pseudo_random(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[test]
fn linear_and_embedding_read_weights_in_their_stored_encoding() {
    let (rows, cols, tokens) = (16usize, 64usize, 3usize);
    let values = pseudo_random(rows * cols, 7);
    // Q8_0 bytes, and the f32 values they decode to.
    let row_bytes = QuantType::Q8_0.row_bytes(cols).unwrap();
    let mut q8 = vec![0u8; rows * row_bytes];
    for (src, dst) in values.chunks(cols).zip(q8.chunks_mut(row_bytes)) {
        quantize_row(QuantType::Q8_0, src, dst).unwrap();
    }
    let mut decoded = vec![0f32; rows * cols];
    for (src, dst) in q8.chunks(row_bytes).zip(decoded.chunks_mut(cols)) {
        dequantize_row(QuantType::Q8_0, src, dst).unwrap();
    }
    let spec = |name: &str, encoding| WeightSpec {
        name: name.to_owned(),
        dtype: DType::F32,
        shape: vec![rows as u64, cols as u64],
        encoding,
        device: Device::Cpu,
    };
    let half: Vec<u8> = values
        .iter()
        .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
        .collect();
    let half_decoded: Vec<f32> = values
        .iter()
        .map(|v| half::bf16::from_f32(*v).to_f32())
        .collect();

    for (encoding, bytes, reference) in [
        (Encoding::Q8_0, q8.clone(), decoded.clone()),
        (Encoding::BFloat16, half.clone(), half_decoded.clone()),
        (
            Encoding::Float32,
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            values.clone(),
        ),
    ] {
        let mut store = WeightStore::new();
        let len = bytes.len();
        store
            .insert(WeightData::new(
                spec("proj.weight", encoding),
                Arc::new(bytes.clone()),
                0..len,
            ))
            .unwrap();
        store
            .insert(WeightData::new(
                spec("embed.weight", encoding),
                Arc::new(bytes),
                0..len,
            ))
            .unwrap();
        let mut dict = std::collections::BTreeMap::new();
        dict.insert("weight".to_owned(), spec("weight", encoding));

        // y = x Wᵀ as a Linear layer: lowered to the weight kernel.
        let linear = Linear::new(cols as u64, rows as u64, DType::F32, false);
        linear.load_state_dict(&dict).unwrap();
        let graph = Graph::new("linear");
        let x = graph.input(
            "x",
            TensorType::new(DType::F32, [tokens as u64, cols as u64]),
        );
        let renamed = |ir: GraphIr, name: &str| {
            let mut ir = ir;
            ir.weights[0].name = name.to_owned();
            ir
        };
        graph.output(&[&linear.forward(&x)]);
        let ir = renamed(graph.build().unwrap(), "proj.weight");
        let program = compile(&ir).unwrap();
        assert!(
            program
                .steps
                .iter()
                .any(|s| matches!(s.kernel, Kernel::Linear { .. })),
            "{encoding}: {:?}",
            program.steps
        );
        let xs = pseudo_random(tokens * cols, 11);
        for precision in [Precision::Exact, Precision::Fast] {
            let out = Executor::new(Arc::new(program.clone()), &store, precision)
                .unwrap()
                .run(vec![Tensor::f32(vec![tokens, cols], xs.clone())], None)
                .unwrap();
            for t in 0..tokens {
                for r in 0..rows {
                    let expected: f32 = (0..cols)
                        .map(|c| xs[t * cols + c] * reference[r * cols + c])
                        .sum();
                    let actual = out[0].as_f32()[t * rows + r];
                    let tolerance = if precision == Precision::Fast && encoding == Encoding::Q8_0 {
                        3e-2
                    } else {
                        1e-4
                    };
                    assert!(
                        (actual - expected).abs() < tolerance,
                        "{encoding} {precision:?}: {actual} vs {expected}"
                    );
                }
            }
        }

        // Embedding rows decoded one by one.
        let embedding = Embedding::new(rows as u64, cols as u64, DType::F32);
        embedding.load_state_dict(&dict).unwrap();
        let graph = Graph::new("embed");
        let ids = graph.input("ids", TensorType::new(DType::I64, [2u64]));
        graph.output(&[&embedding.forward(&ids)]);
        let ir = renamed(graph.build().unwrap(), "embed.weight");
        let out = run(&ir, &store, vec![Tensor::i64(vec![2], vec![5, 0])]);
        assert_eq!(
            out[0].as_f32()[..cols],
            reference[5 * cols..6 * cols],
            "{encoding}"
        );
        let error = Executor::new(Arc::new(compile(&ir).unwrap()), &store, Precision::Exact)
            .unwrap()
            .run(vec![Tensor::i64(vec![2], vec![5, 99])], None)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("token id 99 is outside the vocabulary of 16"),
            "{error}"
        );
    }
}

#[test]
fn steps_that_read_only_weights_run_once_at_load() {
    // y = x @ transpose(reshape(2·W + 1)): everything but the product reads
    // only the weight.
    let (heads, rows, cols, tokens) = (2usize, 3usize, 4usize, 5usize);
    let values = pseudo_random(heads * rows * cols, 3);
    let spec = WeightSpec {
        name: "w".to_owned(),
        dtype: DType::F32,
        shape: vec![(heads * rows) as u64, cols as u64],
        encoding: Encoding::Float32,
        device: Device::Cpu,
    };
    let mut store = WeightStore::new();
    store
        .insert(WeightData::from_f32(spec.clone(), &values))
        .unwrap();
    let graph = Graph::new("hoist");
    let x = graph.input(
        "x",
        TensorType::new(
            DType::F32,
            [
                Dim::Static(heads as u64),
                Dim::sym("T"),
                Dim::Static(cols as u64),
            ],
        ),
    );
    let w = &(&graph.weight(&spec) * 2.0) + 1.0;
    let per_head = ops::reshape(&w, [heads as i64, rows as i64, cols as i64]);
    let y = ops::matmul(&x, &ops::transpose(&per_head, 1, 2));
    graph.output(&[&y]);
    let program = compile(&graph.build().unwrap()).unwrap();
    assert!(program.steps.len() > 1, "{:?}", program.steps);

    let executor = Executor::new(Arc::new(program), &store, Precision::Exact).unwrap();
    let bound = executor.program();
    assert_eq!(
        bound.steps.len(),
        1,
        "only the product is left: {:?}",
        bound.steps
    );
    assert_eq!(bound.graph.weights.len(), 2);
    let xs = pseudo_random(heads * tokens * cols, 5);
    for _ in 0..2 {
        let out = executor
            .run(
                vec![Tensor::f32(vec![heads, tokens, cols], xs.clone())],
                None,
            )
            .unwrap();
        assert_eq!(out[0].shape, vec![heads, tokens, rows]);
        for h in 0..heads {
            for t in 0..tokens {
                for r in 0..rows {
                    let expected: f32 = (0..cols)
                        .map(|c| {
                            let weight = values[(h * rows + r) * cols + c] * 2.0 + 1.0;
                            xs[(h * tokens + t) * cols + c] * weight
                        })
                        .sum();
                    let actual = out[0].as_f32()[(h * tokens + t) * rows + r];
                    assert!((actual - expected).abs() < 1e-5, "{actual} vs {expected}");
                }
            }
        }
    }
}
