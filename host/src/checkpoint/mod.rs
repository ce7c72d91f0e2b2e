//! Checkpoints: reading weights and metadata from safetensors and GGUF files,
//! memory-mapped and zero-copy.

pub mod gguf;
