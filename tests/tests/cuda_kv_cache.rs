//! The CUDA backend's bf16 KV cache (`--kv-cache-dtype`, bf16 by default
//! with bf16 products): half the bytes of the f32 cache, logits within bf16
//! rounding of the f32 cache's; its fp8 (E4M3) cache, a quarter of the
//! bytes; and the tensor-core flash attention that prefill runs over both,
//! and the tensor-core decode attention, against the portable
//! kernels (`--attention-backend portable`). On the
//! kernel emulator, or a GPU with KILN_TEST_CUDA_DEVICE.

use kiln_host::engine::Generator;
use kiln_host::model::synthetic::ShapeDtype;
use kiln_host::model::{LoadOptions, Model};
use kiln_host::runtime::cuda::{AttentionBackend, WeightDtype};
use kiln_host::runtime::KvCacheDtype;

fn load(kv_cache_dtype: KvCacheDtype, attention_backend: AttentionBackend) -> Model {
    load_shape("tiny-llama.json", kv_cache_dtype, attention_backend)
}

/// The shape `tests/fixtures/shapes/<file>` with random f32 weights.
fn load_shape(
    file: &str,
    kv_cache_dtype: KvCacheDtype,
    attention_backend: AttentionBackend,
) -> Model {
    let options = LoadOptions {
        dtype: WeightDtype::Float32,
        kv_cache_dtype,
        attention_backend,
        ..kiln_tests::models::shape_options(kiln_tests::models::cuda_test_device())
    };
    kiln_tests::models::shape_model(file, ShapeDtype::F32, &options)
}

/// Largest |a - b| over the largest |a|, and whether any element differs.
fn compare(a: &[f32], b: &[f32]) -> (f32, bool) {
    (kiln_tests::models::relative_difference(a, b), a != b)
}

/// The largest relative |Δ| between the logits of `a` and `b` over a prompt
/// and four decode steps reading it back from the cache (greedy on `a`),
/// and whether any logit differed.
fn logits_apart(a: &Model, b: &Model) -> (f32, bool) {
    let prompt: Vec<u32> = (0..10).map(|i| (i * 53 + 7) % 768).collect();
    let (mut a, mut b) = (
        Generator::new(a, 16).unwrap(),
        Generator::new(b, 16).unwrap(),
    );
    let (mut worst, mut differs) = (0f32, false);
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
    (worst, differs)
}

#[test]
fn a_bf16_cache_halves_the_bytes_and_stays_within_bf16_rounding() {
    let portable = AttentionBackend::Portable;
    let f32_cache = load(KvCacheDtype::Float32, portable);
    let bf16_cache = load(KvCacheDtype::BFloat16, portable);
    assert_eq!(f32_cache.backend.kv_bytes(1), 4);
    assert_eq!(bf16_cache.backend.kv_bytes(1), 2);
    let (worst, differs) = logits_apart(&f32_cache, &bf16_cache);
    assert!(
        differs,
        "the bf16 cache gave the f32 cache's logits exactly"
    );
    assert!(worst < 1e-2, "relative |Δ| {worst:.2e}");
}

/// E4M3 keeps 3 bits of mantissa (bf16: 7): a quarter of the f32 cache's
/// bytes, logits further from the f32 cache's than the bf16 cache's but
/// within E4M3's rounding. The prompt's cache is written by the cache-write
/// kernel, the decode steps' by the q/k/v GEMV (`store_rotated`); either
/// writing another type than attention reads would leave the logits far off.
#[test]
fn an_fp8_cache_quarters_the_bytes_and_stays_within_e4m3_rounding() {
    let portable = AttentionBackend::Portable;
    let f32_cache = load(KvCacheDtype::Float32, portable);
    let bf16_cache = load(KvCacheDtype::BFloat16, portable);
    let fp8_cache = load(KvCacheDtype::Fp8E4m3, portable);
    assert_eq!(fp8_cache.backend.kv_bytes(1), 1);
    let (bf16_apart, _) = logits_apart(&f32_cache, &bf16_cache);
    let (fp8_apart, differs) = logits_apart(&f32_cache, &fp8_cache);
    println!("relative |Δ| from the f32 cache: bf16 {bf16_apart:.2e}, fp8 {fp8_apart:.2e}");
    assert!(
        differs && fp8_apart > bf16_apart,
        "the fp8 cache is no coarser than bf16"
    );
    assert!(fp8_apart < 6e-2, "relative |Δ| {fp8_apart:.2e}");
}

/// A prompt of 150 tokens (two query tiles of 128 rows, three key tiles),
/// then a chunk of 40 more (a prefill that starts mid-sequence), then decode
/// steps: every row's logits on tensor cores within bf16 rounding of the
/// portable kernels'. Flash attention rounds q and the softmax weights to
/// bf16, so some logit must differ: if none did, it never ran. Heads of 64
/// and of 128 (whose tiles take more than 48 KiB of shared memory: on a GPU,
/// the kernel's opt-in).
#[test]
fn prefill_attention_on_tensor_cores_matches_the_portable_kernels() {
    for shape in ["tiny-llama.json", "tiny-llama-d128.json"] {
        for dtype in [KvCacheDtype::BFloat16, KvCacheDtype::Fp8E4m3] {
            flash_against_portable(shape, dtype);
        }
    }
}

fn flash_against_portable(shape: &str, dtype: KvCacheDtype) {
    println!("{shape}, {} cache", dtype.name());
    let portable = load_shape(shape, dtype, AttentionBackend::Portable);
    let flash = load_shape(shape, dtype, AttentionBackend::Auto);
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
    // Decode rows run on tensor cores too.
    for token in [5u32, 17, 400] {
        let (x, y) = (
            a.feed(&[token], false).unwrap(),
            b.feed(&[token], false).unwrap(),
        );
        let (delta, _) = compare(&x[0], &y[0]);
        assert!(delta < 2e-2, "decode: relative |Δ| {delta:.2e}");
    }
}

/// Steps of fewer rows than flash attention takes (chunks of 8, then single
/// tokens) up to 100 positions, split in two rounds of 64 keys (a warp a
/// chunk of 16, the second round partial; a warp's second chunk and its
/// rescaling are `kernels/tests/cuda_flash_attention.rs`'s): over the bf16 and the fp8
/// cache `auto` takes the tensor-core decode kernel (`decode_attention.cu`,
/// q and the softmax weights rounded to bf16), every row's logits within
/// bf16 rounding of the portable kernel's and not all equal (else it never
/// ran). Also at eight query heads a key/value head (`tiny-llama-g8.json`),
/// where the decode kernel's merge of a single token's splits gives each of
/// its four warps two heads, and the portable kernel's blocks take four.
#[test]
fn decode_attention_on_tensor_cores_matches_the_portable_kernels() {
    for (shape, dtypes) in [
        (
            "tiny-llama.json",
            &[KvCacheDtype::BFloat16, KvCacheDtype::Fp8E4m3][..],
        ),
        ("tiny-llama-g8.json", &[KvCacheDtype::BFloat16][..]),
    ] {
        for &dtype in dtypes {
            decode_against_portable(shape, dtype);
        }
    }
}

fn decode_against_portable(shape: &str, dtype: KvCacheDtype) {
    let tokens: Vec<u32> = (0..100).map(|i| (i * 53 + 7) % 768).collect();
    let steps = tokens[..96].chunks(8).chain(tokens[96..].chunks(1));
    let name = format!("{shape}, {}", dtype.name());
    let portable = load_shape(shape, dtype, AttentionBackend::Portable);
    let auto = load_shape(shape, dtype, AttentionBackend::Auto);
    let (mut a, mut b) = (
        Generator::new(&portable, 128).unwrap(),
        Generator::new(&auto, 128).unwrap(),
    );
    let (mut worst, mut differs) = (0f32, false);
    for (i, step) in steps.enumerate() {
        let x = a.feed(step, true).unwrap();
        let y = b.feed(step, true).unwrap();
        for (row, (p, q)) in x.iter().zip(&y).enumerate() {
            let (delta, changed) = compare(p, q);
            assert!(
                delta < 6e-3,
                "{name} cache, step {i}, row {row}: relative |Δ| {delta:.2e}"
            );
            (worst, differs) = (worst.max(delta), differs || changed);
        }
    }
    println!("{name} cache: relative |Δ| {worst:.2e}");
    assert!(
        differs,
        "{name} cache: the portable kernel's logits exactly"
    );
}
