//! What the benchmarks share.

use kiln_host::tokenizer::Tokenizer;

/// SmolLM2's tokenizer (byte-level BPE, 49,152 tokens), from the GGUF that
/// `.ci/setup` fetches, or `KILN_SMOLLM2_GGUF`.
pub fn smollm2_tokenizer() -> Tokenizer {
    let path = std::env::var("KILN_SMOLLM2_GGUF").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/models/SmolLM2-135M-Instruct.Q4_1.gguf"
        )
        .to_owned()
    });
    let resolved = kiln_host::model::resolve(&path, None, None).expect("SmolLM2: run .ci/setup");
    let (checkpoint, _) =
        kiln_host::model::open_checkpoint(&resolved, kiln_host::checkpoint::TensorBytes::Mapped)
            .unwrap();
    kiln_host::model::load_tokenizer(&resolved, &checkpoint)
        .unwrap()
        .unwrap()
}
