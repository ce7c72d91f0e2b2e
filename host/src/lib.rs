//! The Kiln host: everything that is not specific to one architecture.
//!
//! Today: plugin discovery and loading through the stable ABI, the registry of
//! architectures, logging, and the command line. See `docs/ARCHITECTURE.md`.

pub mod checkpoint;
pub mod cli;
mod commands;
pub mod compiler;
pub mod device;
pub mod embedding;
pub mod engine;
pub mod logging;
pub mod model;
pub mod plugins;
pub mod runtime;
pub mod scheduler;
pub mod server;
pub mod tokenizer;
pub mod verify;
