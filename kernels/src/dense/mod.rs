//! Dense f32 kernels: activations, matrix products (with f32, f16 and bf16 weights),
//! normalizations, softmax, rotary embeddings, paged attention and
//! mixture-of-experts routing.
//!
//! Every function works on row-major slices and checks its sizes with
//! `assert!` (a size mismatch is a bug in the caller, the compiler, which
//! validates shapes before it runs anything).

pub mod activation;
pub mod attention;
pub mod matmul;
pub mod moe;
pub mod norm;
pub mod rope;
