//! DeepSeek's latent attention at its real head size on the CUDA backend
//! (the kernel emulator, or a GPU with KILN_TEST_CUDA_DEVICE): the cache
//! holds one head of 576 (`kv_lora_rank` 512 + `qk_rope_head_dim` 64), more
//! than the 256 of the standard paged-attention kernel, so the `_wide`
//! kernels run. Random weights at a small DeepSeek shape
//! (`tests/fixtures/shapes/tiny-deepseek-latent576.json`), in f32 with an
//! f32 cache, against the CPU backend.

use kiln_host::device::DeviceChoice;
use kiln_host::engine::Generator;
use kiln_host::model::synthetic::ShapeDtype;
use kiln_host::model::{LoadOptions, Model};
use kiln_host::runtime::cuda::WeightDtype;
use kiln_host::runtime::KvCacheDtype;
use kiln_tests::models::relative_difference;

fn load(device: DeviceChoice) -> Model {
    let options = LoadOptions {
        kv_cache_dtype: KvCacheDtype::Float32,
        dtype: WeightDtype::Float32,
        ..kiln_tests::models::shape_options(device)
    };
    kiln_tests::models::shape_model("tiny-deepseek-latent576.json", ShapeDtype::F32, &options)
}

#[test]
fn a_576_wide_latent_head_matches_the_cpu_in_prefill_and_decode() {
    let cpu = load(DeviceChoice::Cpu);
    let cuda = load(kiln_tests::models::cuda_test_device());
    assert_eq!(cpu.config.kv.head_dim, 576);
    let prompt: Vec<u32> = (0..11).map(|i| (i * 37 + 5) % 512).collect();
    let mut on_cpu = Generator::new(&cpu, prompt.len() + 4).unwrap();
    let mut on_cuda = Generator::new(&cuda, prompt.len() + 4).unwrap();
    let a = on_cpu.feed(&prompt, true).unwrap();
    let b = on_cuda.feed(&prompt, true).unwrap();
    assert_eq!(a.len(), prompt.len());
    for (row, (a, b)) in a.iter().zip(&b).enumerate() {
        let d = relative_difference(a, b);
        assert!(d < 1e-4, "prefill row {row}: relative |Δ| {d:.2e}");
    }
    for (step, token) in [3u32, 141, 59, 265].into_iter().enumerate() {
        let a = on_cpu.feed(&[token], false).unwrap().remove(0);
        let b = on_cuda.feed(&[token], false).unwrap().remove(0);
        let d = relative_difference(&a, &b);
        assert!(d < 1e-4, "decode {step}: relative |Δ| {d:.2e}");
    }
}
