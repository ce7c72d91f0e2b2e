//! The CUDA backend's bf16 KV cache (`--kv-cache-dtype`, bf16 by default
//! with bf16 products): half the bytes of the f32 cache, logits within bf16
//! rounding of the f32 cache's; and the tensor-core flash attention that
//! prefill runs over it, against the portable kernels
//! (`--attention-backend portable`). On the kernel emulator, or a GPU with
//! KILN_TEST_CUDA_DEVICE.

use kiln_host::engine::Generator;
use kiln_host::model::synthetic::ShapeDtype;
use kiln_host::model::{LoadOptions, Model};
use kiln_host::runtime::cuda::{AttentionBackend, WeightDtype};
use kiln_host::runtime::KvCacheDtype;

fn load(kv_cache_dtype: KvCacheDtype, attention_backend: AttentionBackend) -> Model {
    let options = LoadOptions {
        dtype: WeightDtype::Float32,
        kv_cache_dtype,
        attention_backend,
        ..kiln_tests::models::shape_options(kiln_tests::models::cuda_test_device())
    };
    kiln_tests::models::tiny_llama_shape(ShapeDtype::F32, &options)
}

/// Largest |a - b| over the largest |a|, and whether any element differs.
fn compare(a: &[f32], b: &[f32]) -> (f32, bool) {
    (kiln_tests::models::relative_difference(a, b), a != b)
}

#[test]
fn a_bf16_cache_halves_the_bytes_and_stays_within_bf16_rounding() {
    let portable = AttentionBackend::Portable;
    let f32_cache = load(KvCacheDtype::Float32, portable);
    let bf16_cache = load(KvCacheDtype::BFloat16, portable);
    assert_eq!(f32_cache.backend.kv_bytes(1), 4);
    assert_eq!(bf16_cache.backend.kv_bytes(1), 2);
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
        let (delta, changed) = compare(&x, &y);
        (worst, differs) = (worst.max(delta), differs || changed);
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

/// A prompt of 150 tokens (two query tiles of 128 rows, three key tiles),
/// then a chunk of 40 more (a prefill that starts mid-sequence), then decode
/// steps: every row's logits on tensor cores within bf16 rounding of the
/// portable kernels'. Flash attention rounds q and the softmax weights to
/// bf16, so some logit must differ: if none did, it never ran.
#[test]
fn prefill_attention_on_tensor_cores_matches_the_portable_kernels() {
    let portable = load(KvCacheDtype::BFloat16, AttentionBackend::Portable);
    let flash = load(KvCacheDtype::BFloat16, AttentionBackend::Auto);
    let (mut a, mut b) = (
        Generator::new(&portable, 200).unwrap(),
        Generator::new(&flash, 200).unwrap(),
    );
    let tokens: Vec<u32> = (0..190).map(|i| (i * 53 + 7) % 768).collect();
    for chunk in [&tokens[..150], &tokens[150..]] {
        let x = a.feed(chunk, true).unwrap();
        let y = b.feed(chunk, true).unwrap();
        let (mut worst, mut differs) = (0f32, false);
        for (row, (p, q)) in x.iter().zip(&y).enumerate() {
            let (delta, changed) = compare(p, q);
            assert!(
                delta < 2e-2,
                "chunk of {}, row {row}: relative |Δ| {delta:.2e}",
                chunk.len()
            );
            (worst, differs) = (worst.max(delta), differs || changed);
        }
        assert!(
            differs,
            "chunk of {}: the portable kernels' logits exactly",
            chunk.len()
        );
        println!("chunk of {}: relative |Δ| {worst:.2e}", chunk.len());
    }
    // Decode rows run the portable kernel under both backends.
    for token in [5u32, 17, 400] {
        let (x, y) = (
            a.feed(&[token], false).unwrap(),
            b.feed(&[token], false).unwrap(),
        );
        let (delta, _) = compare(&x[0], &y[0]);
        assert!(delta < 2e-2, "decode: relative |Δ| {delta:.2e}");
    }
}
