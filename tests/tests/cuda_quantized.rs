//! GGUF blocks kept packed on the CUDA backend (the kernel emulator, or a GPU
//! with KILN_TEST_CUDA_DEVICE): decode steps read them with the GEMV kernels,
//! prompts of up to 64 tokens with the tensor-core kernels of `qmatmul.cu`,
//! longer ones expand them to bf16 for the GEMM, and the experts of a
//! mixture are read packed in all. Random weights at small Llama and Qwen3-MoE
//! shapes in each format, against the CPU backend's exact arithmetic on the
//! same bytes; and with `--precision fast`, whose decode GEMVs take x in 8
//! bits, against the CPU's exact and fast arithmetic.

use kiln_host::device::DeviceChoice;
use kiln_host::engine::Generator;
use kiln_host::model::synthetic::ShapeDtype;
use kiln_host::model::{LoadOptions, Model};
use kiln_host::runtime::cuda::CudaExecutor;
use kiln_host::runtime::{KvCacheDtype, Precision};
use kiln_tests::models::{decode_agrees, relative_difference};

fn load(shape: &str, dtype: ShapeDtype, device: DeviceChoice) -> Model {
    load_in(shape, dtype, device, Precision::Exact)
}

fn load_in(shape: &str, dtype: ShapeDtype, device: DeviceChoice, precision: Precision) -> Model {
    // An f32 cache: only the products differ from the CPU.
    let options = LoadOptions {
        kv_cache_dtype: KvCacheDtype::Float32,
        precision,
        ..kiln_tests::models::shape_options(device)
    };
    kiln_tests::models::shape_model(shape, dtype, &options)
}

/// Every storage of random weights whose matrices the GPU keeps packed
/// (IQ4_XS: the tiny shapes' rows all fill super-blocks of 256; IQ4_NL is
/// mixed with it in `iq4_nl_and_iq4_xs_in_one_model_match_the_cpu`).
const PACKED: [ShapeDtype; 10] = [
    ShapeDtype::Q4KM,
    ShapeDtype::Q5KM,
    ShapeDtype::Q3KM,
    ShapeDtype::Q2K,
    ShapeDtype::Q8_0,
    ShapeDtype::Q4_0,
    ShapeDtype::Q5_0,
    ShapeDtype::Q4_1,
    ShapeDtype::Q5_1,
    ShapeDtype::Iq4Xs,
];

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
    for dtype in PACKED {
        let (cpu, cuda) = cpu_and_cuda("tiny-llama.json", dtype);
        // Both layers' q, k and v run as one GEMV that rotates q and k, the
        // second's v at Q6_K in Q4_K_M and Q5_K_M (kiln_gemv_q4_k_q6_k),
        // every v at Q5_K in Q3_K_M and at Q3_K in Q2_K.
        let executor: &CudaExecutor = cuda.backend.as_any().downcast_ref().unwrap();
        assert_eq!(executor.rotations_in_gemv(), 2, "{dtype:?}");
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

/// Q4_K_M and Q5_K_M keep the last layer's down matrices at Q6_K (as
/// llama-quantize does): its experts' down matrices are Q6_K, the first
/// layer's and every gate and up matrix Q4_K or Q5_K.
#[test]
fn packed_gguf_experts_match_the_cpu() {
    let prompt: Vec<u32> = (0..9).map(|i| (i * 53 + 7) % 256).collect();
    for dtype in PACKED {
        let (cpu, cuda) = cpu_and_cuda("tiny-qwen3-moe.json", dtype);
        // One token a step: every product reads the blocks with f32
        // activations, so the two backends agree to rounding.
        decode_agrees(&cpu, &cuda, &prompt, &format!("{dtype:?}"));
    }
}

/// Decode with x quantized to 8 bits in blocks of 32 for the GEMVs of
/// packed matrices (all but the logits'): it differs from the GPU's exact
/// decode at every step (so the 8-bit path ran), and lies no farther from
/// the CPU's exact logits than twice as far as the CPU's own fast
/// arithmetic does (whose products the GPU's cannot match to rounding: a
/// value of x a rounding apart on the two backends can take the next quant,
/// and a few such steps of 1/127 move these random models' logits by ~1e-2;
/// the GEMV kernels themselves are compared with the products of 8-bit x in
/// kernels/tests/cuda_gemv.rs).
#[test]
fn fast_precision_decodes_with_8_bit_activations() {
    let cuda = kiln_tests::models::cuda_test_device();
    let prompt: Vec<u32> = (0..8).map(|i| (i * 41 + 3) % 512).collect();
    for dtype in PACKED {
        let load = |device, precision| load_in("tiny-llama.json", dtype, device, precision);
        let models = [
            load(cuda, Precision::Fast),
            load(cuda, Precision::Exact),
            load(DeviceChoice::Cpu, Precision::Fast),
            load(DeviceChoice::Cpu, Precision::Exact),
        ];
        let mut feeds = models
            .each_ref()
            .map(|m| Generator::new(m, prompt.len()).unwrap());
        let (mut gpu_error, mut cpu_error) = (0f32, 0f32);
        for (position, &token) in prompt.iter().enumerate() {
            let [fast, exact, cpu_fast, cpu_exact] = feeds
                .each_mut()
                .map(|g| g.feed(&[token], false).unwrap().remove(0));
            let moved = relative_difference(&exact, &fast);
            assert!(
                moved > 1e-5,
                "{dtype:?} decode {position}: fast is exact's {moved:.2e}"
            );
            gpu_error = gpu_error.max(relative_difference(&cpu_exact, &fast));
            cpu_error = cpu_error.max(relative_difference(&cpu_exact, &cpu_fast));
        }
        assert!(
            gpu_error <= 2.0 * cpu_error,
            "{dtype:?}: fast decode {gpu_error:.2e} from exact, the CPU's {cpu_error:.2e}"
        );
    }
}

/// A model in IQ4_NL and IQ4_XS at once, as llama.cpp's IQ4_XS files are
/// where rows do not fill super-blocks of 256: at a hidden size of 192, q,
/// k, v, o, gate, up and the logits' matrix are IQ4_NL, down IQ4_XS. Decode
/// reads both packed in the GEMVs, a 12-token prompt on tensor cores
/// (qmatmul.cu), a 70-token one expands them to bf16.
#[test]
fn iq4_nl_and_iq4_xs_in_one_model_match_the_cpu() {
    let (cpu, cuda) = cpu_and_cuda("tiny-llama-h192.json", ShapeDtype::Iq4Xs);
    let prompt: Vec<u32> = (0..70).map(|i| (i * 37 + 5) % 512).collect();
    // Within 1e-4 a step: read packed with f32 x (bf16 copies of the
    // weights would be ~1e-2 away).
    decode_agrees(&cpu, &cuda, &prompt[..12], "IQ4_NL + IQ4_XS");
    for len in [12, 70] {
        let prompt = &prompt[..len];
        let a = Generator::new(&cpu, len).unwrap().feed(prompt, true);
        let b = Generator::new(&cuda, len).unwrap().feed(prompt, true);
        for (row, (a, b)) in a.unwrap().iter().zip(&b.unwrap()).enumerate() {
            let d = relative_difference(a, b);
            assert!(d < 2e-2, "prefill of {len} row {row}: relative |Δ| {d:.2e}");
        }
    }
}
