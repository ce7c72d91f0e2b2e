//! GGUF blocks kept packed on the CUDA backend (the kernel emulator, or a GPU
//! with KILN_TEST_CUDA_DEVICE): decode steps read them with the GEMV kernels,
//! prompts of up to 64 tokens with the tensor-core kernels of `qmatmul.cu`,
//! longer ones expand them to bf16 for the GEMM, and the experts of a
//! mixture are read packed in all. Random weights at small Llama and Qwen3-MoE
//! shapes in each format, against the CPU backend's exact arithmetic on the
//! same bytes.

use kiln_host::device::DeviceChoice;
use kiln_host::engine::Generator;
use kiln_host::model::synthetic::ShapeDtype;
use kiln_host::model::{LoadOptions, Model};
use kiln_host::runtime::KvCacheDtype;
use kiln_tests::models::{decode_agrees, relative_difference};

fn load(shape: &str, dtype: ShapeDtype, device: DeviceChoice) -> Model {
    // An f32 cache: only the products differ from the CPU.
    let options = LoadOptions {
        kv_cache_dtype: KvCacheDtype::Float32,
        ..kiln_tests::models::shape_options(device)
    };
    kiln_tests::models::shape_model(shape, dtype, &options)
}

/// The shape in `dtype` on the CPU and on the CUDA backend under test.
fn cpu_and_cuda(shape: &str, dtype: ShapeDtype) -> (Model, Model) {
    let cuda = kiln_tests::models::cuda_test_device();
    (
        load(shape, dtype, DeviceChoice::Cpu),
        load(shape, dtype, cuda),
    )
}

#[test]
fn packed_gguf_matrices_match_the_cpu_in_prefill_and_decode() {
    let prompt = |len: u32| -> Vec<u32> { (0..len).map(|i| (i * 37 + 5) % 512).collect() };
    for dtype in [ShapeDtype::Q4KM, ShapeDtype::Q8_0, ShapeDtype::Q4_0] {
        let (cpu, cuda) = cpu_and_cuda("tiny-llama.json", dtype);
        // One token a step: the GEMV reads the blocks, activations in f32.
        decode_agrees(&cpu, &cuda, &prompt(12), &format!("{dtype:?}"));
        // The whole prompt in one step, x rounded to bf16: 12 and 64 rows
        // on tensor cores reading the blocks (one tile of x rows, partly
        // and wholly filled), 70 rows on the blocks expanded to bf16.
        for len in [12, 64, 70] {
            let prompt = prompt(len);
            let a = Generator::new(&cpu, prompt.len())
                .unwrap()
                .feed(&prompt, true);
            let b = Generator::new(&cuda, prompt.len())
                .unwrap()
                .feed(&prompt, true);
            let (a, b) = (a.unwrap(), b.unwrap());
            assert_eq!(a.len(), prompt.len());
            for (row, (a, b)) in a.iter().zip(&b).enumerate() {
                let d = relative_difference(a, b);
                assert!(
                    d < 2e-2,
                    "{dtype:?} prefill of {len} row {row}: relative |Δ| {d:.2e}"
                );
            }
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
        let (cpu, cuda) = cpu_and_cuda("tiny-qwen3-moe.json", dtype);
        // One token a step: every product reads the blocks with f32
        // activations, so the two backends agree to rounding.
        decode_agrees(&cpu, &cuda, &prompt, &format!("{dtype:?}"));
    }
}
