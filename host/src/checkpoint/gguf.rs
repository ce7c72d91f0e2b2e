//! GGUF files (being written).
