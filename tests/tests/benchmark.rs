//! `host benchmark`: offline throughput of the engine on a real model and,
//! with `--shape`, on random weights at a shape, on the CPU and on the CUDA
//! backend (the kernel emulator, or a GPU with KILN_TEST_CUDA_DEVICE).

use std::path::PathBuf;

use kiln_tests::{run_host, text, workspace_root};

fn smollm2() -> Option<PathBuf> {
    kiln_tests::models::smollm2_gguf()
}

/// `host benchmark`: every level's requests all finish with exactly
/// `--output-len` tokens, and the numbers are consistent with each other.
#[test]
fn benchmark_runs_every_concurrency_level_to_completion() {
    let model = smollm2().unwrap_or_else(|| panic!("SmolLM2 is missing: run .ci/setup"));
    let model = model.to_str().unwrap();
    // `host benchmark` of SmolLM2 at 12 prompt tokens, 5 generated, and `extra`.
    let run = |extra: &[&str]| -> serde_json::Value {
        let args = [
            "benchmark",
            "--model",
            model,
            "--input-len",
            "12",
            "--output-len",
            "5",
        ];
        let output = run_host([&args[..], extra, &["--json"]].concat(), &[]);
        assert!(output.status.success(), "{}", text(&output).1);
        serde_json::from_slice(&output.stdout).unwrap()
    };
    let report = run(&["--concurrency", "1,3"]);
    assert_eq!(report["device"], "cpu");
    assert_eq!(report["roofline"], serde_json::Value::Null);
    let levels = report["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 2);
    for (level, concurrency) in levels.iter().zip([1u64, 3]) {
        assert_eq!(level["concurrency"], concurrency);
        assert_eq!(level["output_tokens"], concurrency * 5, "{level}");
        let wall = level["wall_s"].as_f64().unwrap();
        let rate = level["output_tok_per_s"].as_f64().unwrap();
        assert!(wall > 0.0 && (rate * wall - (concurrency * 5) as f64).abs() < 1e-6);
        let ttft = level["max_ttft_ms"].as_f64().unwrap();
        assert!(ttft > 0.0 && ttft <= wall * 1e3, "{level}");
    }
    // Warm-up runs before a level are not counted in it.
    let steps = |warmup_runs: &str| {
        let report = run(&["--concurrency", "3", "--warmup-runs", warmup_runs]);
        let level = &report["levels"][0];
        assert_eq!(level["output_tokens"], 15, "{level}");
        level["steps"].as_u64().unwrap()
    };
    assert_eq!(steps("0"), steps("2"));

    // On the CUDA backend it also measures the device's copy bandwidth and
    // puts decode steps against the memory roofline.
    let gguf = workspace_root().join("tests/fixtures/reference/tiny_llama.f32.gguf");
    let device = kiln_tests::models::cuda_test_device().to_string();
    let output = run_host(
        [
            "benchmark",
            "--model",
            gguf.to_str().unwrap(),
            "--device",
            &device,
            "--input-len",
            "4",
            "--output-len",
            "4",
            "--concurrency",
            "1",
            "--json",
        ],
        &[],
    );
    assert!(output.status.success(), "{}", text(&output).1);
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let roofline = &report["roofline"];
    // tiny_llama: 2 layers of 32×32 q/o, 16×32 k/v, 3 × 64×32 MLP matrices
    // in bf16, its 96×32 lm_head, and f32 norms and rope frequencies.
    let bytes = roofline["weight_bytes_per_step"].as_u64().unwrap();
    assert!(
        bytes > 2 * (2 * 32 * 32 + 2 * 16 * 32 + 3 * 64 * 32) * 2,
        "{report}"
    );
    assert!(
        roofline["copy_bytes_per_s"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    let fraction = report["levels"][0]["roofline_fraction"].as_f64().unwrap();
    assert!(fraction > 0.0, "{report}");

    let bad_args: [&[&str]; 5] = [
        &["--concurrency", "0"],
        &["--output-len", "0"],
        &["--temperature=-1"],
        &["--top-p", "1.5"],
        &["--repetition-penalty", "0"],
    ];
    for bad in bad_args {
        let output = run_host([&["benchmark", "--model", model][..], bad].concat(), &[]);
        assert!(!output.status.success());
        let (_, err) = text(&output);
        let flag = bad[0].split('=').next().unwrap();
        assert!(err.starts_with("error: ") && err.contains(flag), "{err}");
    }
}

/// `--shape`: random weights at a shape from a config alone, no checkpoint
/// and no tokenizer, in each storage type, on the CPU and on the CUDA
/// backend, where the roofline counts exactly the shape's matrix products;
/// sampled and penalized (`--temperature`, `--top-p`,
/// `--repetition-penalty`) on the CUDA backend, greedy on the CPU.
#[test]
fn benchmark_runs_a_shape_with_random_weights() {
    let shape = workspace_root().join("tests/fixtures/shapes/tiny-llama.json");
    let shape = shape.to_str().unwrap();
    let device = kiln_tests::models::cuda_test_device().to_string();
    let mut weight_bytes: Vec<u64> = Vec::new();
    for (device, dtype) in [
        ("cpu", "bf16"),
        ("cpu", "q4_k_m"),
        (device.as_str(), "bf16"),
        (device.as_str(), "q4_k_m"),
    ] {
        let sampled = match device {
            "cpu" => [
                "--temperature",
                "0",
                "--top-p",
                "1",
                "--repetition-penalty",
                "1",
            ],
            _ => [
                "--temperature",
                "0.8",
                "--top-p",
                "0.9",
                "--repetition-penalty",
                "1.2",
            ],
        };
        let args = [
            "benchmark",
            "--shape",
            shape,
            "--shape-dtype",
            dtype,
            "--device",
            device,
            "--input-len",
            "6",
            "--output-len",
            "3",
            "--concurrency",
            "1,2",
            "--json",
        ];
        let output = run_host([&args[..], &sampled].concat(), &[]);
        assert!(
            output.status.success(),
            "{device} {dtype}: {}",
            text(&output).1
        );
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        for (field, at) in [("top_p", 3), ("repetition_penalty", 5)] {
            let value = report[field].as_f64().unwrap();
            assert!(
                (value - sampled[at].parse::<f64>().unwrap()).abs() < 1e-6,
                "{field}: {report}"
            );
        }
        for (level, concurrency) in report["levels"].as_array().unwrap().iter().zip([1u64, 2]) {
            assert_eq!(level["output_tokens"], concurrency * 3, "{level}");
            assert!(
                level["prefill_tok_per_s"].as_f64().unwrap() > 0.0,
                "{level}"
            );
            // A prefill and two decode steps at least (a prompt may take
            // more), and the engine thread's time split between its own
            // work and waiting for the device.
            let steps = level["steps"].as_u64().unwrap();
            assert!((3..=12).contains(&steps), "{level}");
            let host = level["host_ms_per_step"].as_f64().unwrap();
            assert!(host > 0.0, "{level}");
            assert!(
                level["device_wait_ms_per_step"].as_f64().unwrap() >= 0.0,
                "{level}"
            );
            // The driver's share of the host's time, where a driver is
            // called (a GPU); none measured on the emulator.
            match level["driver_ms_per_step"].as_f64() {
                Some(driver) => {
                    assert!((0.0..=host).contains(&driver), "{level}");
                    // By kind of call, adding up to it.
                    let by_call = level["driver_ms_per_step_by_call"].as_object().unwrap();
                    assert_eq!(by_call.len(), 8, "{level}");
                    let sum: f64 = by_call.values().map(|v| v.as_f64().unwrap()).sum();
                    assert!((sum - driver).abs() < 1e-9, "{level}");
                }
                None => assert!(level["driver_ms_per_step"].is_null(), "{level}"),
            }
            // Kernels per step, counted by a CUDA device: a decode step of
            // the two layers runs 13 and a sampling kernel (the exact counts
            // are pinned in cuda_graphs.rs), a prefill step more.
            let kernels = level["kernels_per_step"].as_f64();
            // Only picks come back, under a row of logits (3 KB) a step.
            let read = level["read_bytes_per_step"].as_f64();
            match device {
                "cpu" => assert_eq!((kernels, read), (None, None), "{level}"),
                _ => {
                    assert!((14.0..=60.0).contains(&kernels.unwrap()), "{level}");
                    assert!((1.0..3072.0).contains(&read.unwrap()), "{level}");
                }
            }
        }
        if device == "cpu" {
            assert_eq!(report["roofline"], serde_json::Value::Null);
            continue;
        }
        // 2 layers of 256×256 q/o, 128×256 k/v, 3 × 512×256 MLP matrices,
        // and the 768×256 lm_head: two operations per element per token.
        let elements = 2 * (2 * 256 * 256 + 2 * 128 * 256 + 3 * 512 * 256) + 768 * 256;
        let roofline = &report["roofline"];
        assert_eq!(
            roofline["product_flops_per_token"].as_f64().unwrap(),
            2.0 * elements as f64,
            "{report}"
        );
        assert!(
            roofline["gemm_flops_per_s"].as_f64().unwrap() > 0.0,
            "{report}"
        );
        let fraction = report["levels"][0]["prefill_gemm_fraction"]
            .as_f64()
            .unwrap();
        assert!(fraction > 0.0, "{report}");
        weight_bytes.push(roofline["weight_bytes_per_step"].as_u64().unwrap());
    }
    // Q4_K_M stays packed on the device: 4.5 bits a weight (6.5 for the
    // vocabulary matrices) where bf16 takes 16.
    let [bf16, q4_k_m] = weight_bytes[..] else {
        panic!("{weight_bytes:?}")
    };
    assert!(
        q4_k_m * 3 < bf16,
        "bf16 {bf16} B, q4_k_m {q4_k_m} B per step"
    );

    for (args, expected) in [
        (vec!["--shape", "no-such-shape"], "llama3-8b"),
        (
            vec!["--shape", shape, "--model", shape],
            "cannot be used with",
        ),
        (vec!["--shape-dtype", "q4_k_m", "--model", shape], "--shape"),
        (
            vec!["--shape", shape, "--quantization", "q8_0"],
            "--shape's random weights take --shape-dtype",
        ),
        (
            vec![
                "--url",
                "http://127.0.0.1:9",
                "--model",
                "m",
                "--speculative-config",
                r#"{"method": "ngram", "num_speculative_tokens": 2}"#,
            ],
            "the server's own settings apply",
        ),
        (
            vec![
                "--url",
                "http://127.0.0.1:9",
                "--model",
                "m",
                "--warmup-runs",
                "1",
            ],
            "warm the server up",
        ),
        (
            vec![
                "--speculative-config",
                r#"{"method": "ngram"}"#,
                "--shape",
                shape,
            ],
            "needs num_speculative_tokens",
        ),
    ] {
        let output = run_host([&["benchmark"], args.as_slice()].concat(), &[]);
        assert!(!output.status.success());
        let (_, err) = text(&output);
        assert!(err.contains(expected), "{args:?}: {err}");
    }
}

/// `--device cuda-null` runs the CUDA backend's host side over a device that
/// runs nothing: the same steps and the same kernels a step as the CUDA
/// device the tests run on (the emulator in CI), no roofline (nothing to
/// measure), and only `host benchmark` takes it.
#[test]
fn the_null_device_times_the_host_issuing_the_same_kernels() {
    let shape = workspace_root().join("tests/fixtures/shapes/tiny-llama.json");
    let shape = shape.to_str().unwrap();
    let cuda = kiln_tests::models::cuda_test_device().to_string();
    let report = |device: &str| -> serde_json::Value {
        let output = run_host(
            [
                "benchmark",
                "--shape",
                shape,
                "--device",
                device,
                "--input-len",
                "6",
                "--output-len",
                "4",
                "--concurrency",
                "1,3",
                "--json",
            ],
            &[],
        );
        assert!(output.status.success(), "{device}: {}", text(&output).1);
        serde_json::from_slice(&output.stdout).unwrap()
    };
    let (null, real) = (report("cuda-null"), report(&cuda));
    assert!(
        null["device"].as_str().unwrap().contains("null device"),
        "{null}"
    );
    assert_eq!(null["roofline"], serde_json::Value::Null, "{null}");
    let levels = |r: &serde_json::Value| r["levels"].as_array().unwrap().clone();
    for (n, r) in levels(&null).iter().zip(levels(&real)) {
        for field in ["output_tokens", "steps", "kernels_per_step"] {
            assert_eq!(n[field], r[field], "{field}: null {n}, {cuda} {r}");
        }
        assert!(n["host_ms_per_step"].as_f64().unwrap() > 0.0, "{n}");
    }

    let gguf = workspace_root().join("tests/fixtures/reference/tiny_llama.f32.gguf");
    let output = run_host(
        [
            "generate",
            "--model",
            gguf.to_str().unwrap(),
            "--prompt-ids",
            "1,2,3",
            "--device",
            "cuda-null",
        ],
        &[],
    );
    assert!(!output.status.success());
    let (_, err) = text(&output);
    assert!(err.contains("only `host benchmark` takes it"), "{err}");
}

/// With `--speculative-config` each level reports its drafts verified and
/// kept: on the null device, whose picks are token 0 every row, the output
/// repeats, every draft is kept, and the levels take fewer steps.
#[test]
fn a_level_reports_its_drafts() {
    let shape = workspace_root().join("tests/fixtures/shapes/tiny-llama.json");
    let levels = |extra: &[&str]| -> Vec<serde_json::Value> {
        let args = [
            "benchmark",
            "--shape",
            shape.to_str().unwrap(),
            "--device",
            "cuda-null",
            "--input-len",
            "6",
            "--output-len",
            "24",
            "--concurrency",
            "1,2",
            "--json",
        ];
        let output = run_host([&args[..], extra].concat(), &[]);
        assert!(output.status.success(), "{}", text(&output).1);
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        report["levels"].as_array().unwrap().clone()
    };
    let plain = levels(&[]);
    let drafted = levels(&[
        "--speculative-config",
        r#"{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}"#,
    ]);
    for (p, d) in plain.iter().zip(&drafted) {
        assert_eq!(p["draft_tokens"], 0, "{p}");
        let drafts = d["draft_tokens"].as_u64().unwrap();
        assert!(drafts > 0 && d["accepted_tokens"] == drafts, "{d}");
        assert_eq!(d["output_tokens"], p["output_tokens"], "{d}");
        assert!(d["steps"].as_u64() < p["steps"].as_u64(), "{d} against {p}");
    }
}

/// `KILN_PROFILE_STEPS` opens the profiler's range over the steps it names
/// (here on the null device, which counts the kernels in it): two decode
/// steps of the tiny model, then its one measured prefill; a window that
/// means nothing fails the load, naming the variable.
#[test]
fn a_profile_window_covers_the_steps_it_names() {
    let shape = workspace_root().join("tests/fixtures/shapes/tiny-llama.json");
    let shape = shape.to_str().unwrap();
    let run = |window: &str| {
        run_host(
            [
                "benchmark",
                "--shape",
                shape,
                "--device",
                "cuda-null",
                "--input-len",
                "6",
                "--output-len",
                "6",
                "--concurrency",
                "1",
            ],
            &[("KILN_PROFILE_STEPS", window)],
        )
    };
    for (window, expected) in [
        ("decode:2..4", "profiled decode steps 2..4: "),
        ("prefill:0..1", "profiled prefill steps 0..1: "),
    ] {
        let output = run(window);
        let (_, err) = text(&output);
        assert!(output.status.success(), "{window}: {err}");
        let line = err
            .lines()
            .find(|l| l.contains(expected))
            .unwrap_or_else(|| panic!("{window}: no `{expected}` in {err}"));
        let kernels: u64 = line
            .rsplit(": ")
            .next()
            .and_then(|k| k.strip_suffix(" kernels"))
            .and_then(|k| k.parse().ok())
            .unwrap_or_else(|| panic!("{line}"));
        // Two decode steps of 2 layers: 13 kernels and a pick each at most;
        // the prefill is one step.
        match window {
            "decode:2..4" => assert!((26..=28).contains(&kernels), "{line}"),
            _ => assert!((18..=40).contains(&kernels), "{line}"),
        }
    }
    let output = run("decode:3");
    assert!(!output.status.success());
    assert!(
        text(&output).1.contains("KILN_PROFILE_STEPS=decode:3"),
        "{}",
        text(&output).1
    );
}
