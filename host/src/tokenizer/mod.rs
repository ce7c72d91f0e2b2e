//! Tokenizers and chat templates (being written).
