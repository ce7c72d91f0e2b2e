//! Dense bf16 products of 3 to 64 rows of x on the tensor-core kernel of
//! `qmatmul.cu` (`KILN_DENSE_ROWS=tensor-cores`, here `LoadOptions::
//! dense_rows`) instead of cuBLAS, on the CUDA backend under test (the
//! kernel emulator, or a GPU with KILN_TEST_CUDA_DEVICE): the tiny Llama
//! shape with random bf16 weights prefills 3, 12 and 64 tokens (q, k and v in
//! one launch; gate and up with their activation in one) within bf16
//! rounding of the CPU backend, and differently from the cuBLAS route (so
//! the other kernels ran: cuBLAS's route rounds gate and up to bf16, this
//! one keeps them in f32); 70 tokens take cuBLAS in both, and 2 the decode
//! GEMV in both (`gemv::DENSE_GEMV_MAX_M`).

use kiln_host::device::DeviceChoice;
use kiln_host::engine::Generator;
use kiln_host::model::synthetic::ShapeDtype;
use kiln_host::model::{LoadOptions, Model};
use kiln_host::runtime::cuda::DenseRows;
use kiln_host::runtime::KvCacheDtype;
use kiln_tests::models::{relative_difference, shape_options, tiny_llama_shape};

fn load(device: DeviceChoice, dense_rows: DenseRows) -> Model {
    // An f32 cache: only the products differ from the CPU.
    let options = LoadOptions {
        kv_cache_dtype: KvCacheDtype::Float32,
        dense_rows: Some(dense_rows),
        ..shape_options(device)
    };
    tiny_llama_shape(ShapeDtype::Bf16, &options)
}

fn prefill(model: &Model, prompt: &[u32]) -> Vec<Vec<f32>> {
    let mut generator = Generator::new(model, prompt.len()).unwrap();
    generator.feed(prompt, true).unwrap()
}

#[test]
fn dense_rows_on_tensor_cores_match_the_cpu_and_differ_from_cublas() {
    let cuda = kiln_tests::models::cuda_test_device();
    let cpu = load(DeviceChoice::Cpu, DenseRows::Cublas);
    let tensor_cores = load(cuda, DenseRows::TensorCores);
    let cublas = load(cuda, DenseRows::Cublas);
    for len in [2, 3, 12, 64, 70] {
        let prompt: Vec<u32> = (0..len).map(|i| (i * 37 + 5) % 768).collect();
        let want = prefill(&cpu, &prompt);
        let got = prefill(&tensor_cores, &prompt);
        let other = prefill(&cublas, &prompt);
        assert_eq!(got.len(), prompt.len());
        for (row, (a, b)) in want.iter().zip(&got).enumerate() {
            let d = relative_difference(a, b);
            assert!(d < 2e-2, "prefill of {len} row {row}: relative |Δ| {d:.2e}");
        }
        let same_bits = got == other;
        assert_eq!(
            same_bits,
            !(3..=64).contains(&len),
            "prefill of {len}: the tensor-core route ran where it applies, the GEMV or \
             cuBLAS elsewhere"
        );
    }
}
