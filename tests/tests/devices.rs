//! `--device` on the command line: a GPU on a machine without CUDA, and a
//! malformed device, end in one clear line and exit code 1, never a panic.

use kiln_tests::{run_host, text};

#[test]
fn gpu_devices_without_a_cuda_driver_are_refused_in_one_line() {
    let (config, weights) = kiln_tests::models::tiny_model("tiny_llama.json");
    let dir = tempfile::tempdir().unwrap();
    kiln_tests::models::write_model_dir(&config, &weights, dir.path(), false);
    let model = dir.path().to_str().unwrap();
    for (command, device) in [("generate", "gpu"), ("serve", "gpu:1"), ("verify", "gpu")] {
        let mut args = vec![command, "--model", model, "--device", device];
        match command {
            "generate" => args.extend(["--prompt-ids", "1,2"]),
            "verify" => args.extend(["--reference", model]),
            _ => {}
        }
        let output = run_host(&args, &[]);
        let (_, stderr) = text(&output);
        assert_eq!(output.status.code(), Some(1), "{command}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        let no_driver = format!(
            "error: --device {}: the CUDA driver (libcuda.so, driver 580+ for CUDA 13) could not be loaded; use --device cpu",
            if device == "gpu" { "cuda:0" } else { "cuda:1" }
        );
        if !stderr.contains("the CUDA driver (libcuda.so") {
            println!("{command}: a CUDA driver is present here: {stderr}");
        } else {
            assert_eq!(stderr.trim(), no_driver, "{command}");
        }
    }
    let output = run_host(
        [
            "generate",
            "--model",
            model,
            "--prompt-ids",
            "1",
            "--device",
            "tpu",
        ],
        &[],
    );
    let (_, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        stderr.trim(),
        "error: --device tpu: expected cpu, cuda, cuda:N, cuda-emulated or cuda-null"
    );
}

/// A model that does not fit the device fails at start, naming what did not
/// fit: the weights, or (serving) room for the KV cache after the weights and
/// the largest step.
#[test]
fn a_model_that_does_not_fit_the_device_fails_at_start_naming_what() {
    let (config, weights) = kiln_tests::models::tiny_model("tiny_llama.json");
    let dir = tempfile::tempdir().unwrap();
    kiln_tests::models::write_model_dir(&config, &weights, dir.path(), false);
    let model = dir.path().to_str().unwrap();
    let output = run_host(
        [
            "generate",
            "--model",
            model,
            "--prompt-ids",
            "1,2",
            "--device",
            "cuda-emulated",
        ],
        &[("KILN_EMULATOR_MEMORY", "2000")],
    );
    let (_, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains("device memory: `") && stderr.contains("out of memory"),
        "{stderr}"
    );

    // Serving: room for the weights but not for the largest step's
    // activations; then for both but, within the utilization asked for, not
    // for one request's KV cache.
    let gguf = kiln_tests::workspace_root().join("tests/fixtures/reference/tiny_llama.f32.gguf");
    let serve = |memory: &str, utilization: &str| {
        let output = run_host(
            [
                "serve",
                "--model",
                gguf.to_str().unwrap(),
                "--device",
                "cuda-emulated",
                "--port",
                "0",
                "--gpu-memory-utilization",
                utilization,
            ],
            &[("KILN_EMULATOR_MEMORY", memory)],
        );
        let (_, stderr) = text(&output);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        stderr
    };
    let stderr = serve("1000000", "0.9");
    assert!(stderr.contains("activations need"), "{stderr}");
    let stderr = serve("4000000", "0.02");
    assert!(
        stderr.contains("KV cache") && stderr.contains("--gpu-memory-utilization"),
        "{stderr}"
    );
}
