//! GGUF blocks kept packed on the CUDA backend (the kernel emulator, or a GPU
//! with KILN_TEST_CUDA_DEVICE): decode steps read them with the GEMV kernels,
//! prefill expands them to bf16 for the GEMM, and the experts of a mixture
//! are read packed in both. Random weights at small Llama and Qwen3-MoE
//! shapes in each format, against the CPU backend's exact arithmetic on the
//! same bytes.

use kiln_host::device::DeviceChoice;
use kiln_host::engine::Generator;
use kiln_host::model::synthetic::ShapeDtype;
use kiln_host::model::{LoadOptions, Model};
use kiln_host::runtime::KvCacheDtype;

fn load(shape: &str, dtype: ShapeDtype, device: DeviceChoice) -> Model {
    // An f32 cache: only the products differ from the CPU.
    let options = LoadOptions {
        kv_cache_dtype: KvCacheDtype::Float32,
        ..kiln_tests::models::shape_options(device)
    };
    kiln_tests::models::shape_model(shape, dtype, &options)
}

/// Largest |a - b| over the largest |a|.
fn relative_difference(a: &[f32], b: &[f32]) -> f32 {
    let scale = a.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    if worst.is_nan() {
        f32::INFINITY
    } else {
        worst / scale
    }
}

#[test]
fn packed_gguf_matrices_match_the_cpu_in_prefill_and_decode() {
    let prompt: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 512).collect();
    for dtype in [ShapeDtype::Q4KM, ShapeDtype::Q8_0, ShapeDtype::Q4_0] {
        let cpu = load("tiny-llama.json", dtype, DeviceChoice::Cpu);
        let cuda = load(
            "tiny-llama.json",
            dtype,
            kiln_tests::models::cuda_test_device(),
        );
        let generators = || {
            (
                Generator::new(&cpu, prompt.len()).unwrap(),
                Generator::new(&cuda, prompt.len()).unwrap(),
            )
        };
        // One token a step: the GEMV reads the blocks, activations in f32.
        let (mut on_cpu, mut on_cuda) = generators();
        for (position, &token) in prompt.iter().enumerate() {
            let a = on_cpu.feed(&[token], false).unwrap().remove(0);
            let b = on_cuda.feed(&[token], false).unwrap().remove(0);
            let d = relative_difference(&a, &b);
            assert!(
                d < 1e-4,
                "{dtype:?} decode {position}: relative |Δ| {d:.2e}"
            );
        }
        // The whole prompt in one step: more rows than the GEMV takes, so
        // the blocks are expanded to bf16 and x is rounded to bf16.
        let (mut on_cpu, mut on_cuda) = generators();
        let a = on_cpu.feed(&prompt, true).unwrap();
        let b = on_cuda.feed(&prompt, true).unwrap();
        assert_eq!(a.len(), prompt.len());
        for (row, (a, b)) in a.iter().zip(&b).enumerate() {
            let d = relative_difference(a, b);
            assert!(
                d < 2e-2,
                "{dtype:?} prefill row {row}: relative |Δ| {d:.2e}"
            );
        }
    }
}

/// Q4_K_M stores vocabulary-sized rows as Q6_K: with a vocabulary as wide
/// as the model, the experts' down matrices are Q6_K and their gate and up
/// matrices Q4_K.
#[test]
fn packed_gguf_experts_match_the_cpu() {
    let prompt: Vec<u32> = (0..9).map(|i| (i * 53 + 7) % 256).collect();
    for dtype in [ShapeDtype::Q4KM, ShapeDtype::Q8_0, ShapeDtype::Q4_0] {
        let cpu = load("tiny-qwen3-moe.json", dtype, DeviceChoice::Cpu);
        let cuda = load(
            "tiny-qwen3-moe.json",
            dtype,
            kiln_tests::models::cuda_test_device(),
        );
        // One token a step: every product reads the blocks with f32
        // activations, so the two backends agree to rounding.
        let mut on_cpu = Generator::new(&cpu, prompt.len()).unwrap();
        let mut on_cuda = Generator::new(&cuda, prompt.len()).unwrap();
        for (position, &token) in prompt.iter().enumerate() {
            let a = on_cpu.feed(&[token], false).unwrap().remove(0);
            let b = on_cuda.feed(&[token], false).unwrap().remove(0);
            let d = relative_difference(&a, &b);
            assert!(
                d < 1e-4,
                "{dtype:?} decode {position}: relative |Δ| {d:.2e}"
            );
        }
    }
}
