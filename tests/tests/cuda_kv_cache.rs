//! The CUDA backend's bf16 KV cache (`--kv-cache-dtype`, bf16 by default
//! with bf16 products): half the bytes of the f32 cache, logits within bf16
//! rounding of the f32 cache's, on the kernel emulator (or a GPU with
//! KILN_TEST_CUDA_DEVICE).

use kiln_host::engine::Generator;
use kiln_host::model::synthetic::ShapeDtype;
use kiln_host::model::Model;
use kiln_host::runtime::cuda::{KvCacheDtype, WeightDtype};
use kiln_tests::{run_host, text, workspace_root};

fn load(kv_cache_dtype: KvCacheDtype) -> Model {
    let device = kiln_tests::models::cuda_test_device();
    let (weights, dtype) = (ShapeDtype::F32, WeightDtype::Float32);
    kiln_tests::models::tiny_llama_shape(weights, device, dtype, kv_cache_dtype)
}

#[test]
fn a_bf16_cache_halves_the_bytes_and_stays_within_bf16_rounding() {
    let (f32_cache, bf16_cache) = (load(KvCacheDtype::Float32), load(KvCacheDtype::BFloat16));
    assert_eq!(f32_cache.backend.kv_element_bytes(), 4);
    assert_eq!(bf16_cache.backend.kv_element_bytes(), 2);
    let prompt: Vec<u32> = (0..10).map(|i| (i * 53 + 7) % 768).collect();
    let (mut a, mut b) = (
        Generator::new(&f32_cache, 16).unwrap(),
        Generator::new(&bf16_cache, 16).unwrap(),
    );
    let (mut worst, mut differs) = (0f32, false);
    // The prompt, then decode steps reading it back from the cache.
    let mut step = |tokens: &[u32]| {
        let x = a.feed(tokens, false).unwrap().remove(0);
        let y = b.feed(tokens, false).unwrap().remove(0);
        let scale = x.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
        for (p, q) in x.iter().zip(&y) {
            worst = worst.max((p - q).abs() / scale);
            differs |= p != q;
        }
        kiln_host::engine::sampling::argmax(&x)
    };
    let mut token = step(&prompt);
    for _ in 0..4 {
        token = step(&[token]);
    }
    assert!(
        differs,
        "the bf16 cache gave the f32 cache's logits exactly"
    );
    assert!(worst < 1e-2, "relative |Δ| {worst:.2e}");
}

#[test]
fn a_bf16_cache_on_the_cpu_is_refused() {
    let gguf = workspace_root().join("tests/fixtures/reference/tiny_llama.f32.gguf");
    let output = run_host(
        [
            "generate",
            "--model",
            gguf.to_str().unwrap(),
            "--prompt-ids",
            "1,2",
            "--kv-cache-dtype",
            "bfloat16",
        ],
        &[],
    );
    assert!(!output.status.success());
    let (_, err) = text(&output);
    assert!(err.contains("needs a CUDA device"), "{err}");
}
