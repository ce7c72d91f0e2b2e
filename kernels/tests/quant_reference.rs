//! The quantized kernels against fixtures written by llama.cpp's gguf-py
//! (`tests/fixtures/gen_quant_fixtures.py`) and by ggml itself
//! (`tests/fixtures/gen_ggml_quant_fixtures.py`): dequantization bit for
//! bit, the quantizers byte for byte, and both matmul precisions on every
//! available instruction set against a dequantize-then-f64-dot reference.

use std::path::PathBuf;

use kiln_kernels::quant::{
    dequantize_row, quantize_row, Isa, Precision, QuantError, QuantMatrix, QuantType,
};

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/quant")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// A format's fixture blocks and gguf-py's dequantization of them.
fn blocks(ty: QuantType) -> (Vec<u8>, Vec<f32>) {
    let q = fixture(&format!("{}.q", ty.name()));
    let values = f32s(&fixture(&format!("{}.f32", ty.name())));
    assert_eq!(
        q.len() / ty.block_bytes() * ty.block_elems(),
        values.len(),
        "{ty}"
    );
    (q, values)
}

#[test]
fn dequantization_is_bit_exact_with_gguf_py() {
    for ty in QuantType::ALL {
        let (q, expected) = blocks(ty);
        let mut got = vec![f32::NAN; expected.len()];
        dequantize_row(ty, &q, &mut got).unwrap();
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(g.to_bits(), e.to_bits(), "{ty} value {i}: {g} != {e}");
        }
    }
}

#[test]
fn the_32_value_quantizers_are_byte_exact_with_gguf_py() {
    for ty in [
        QuantType::Q8_0,
        QuantType::Q4_0,
        QuantType::Q5_0,
        QuantType::Q5_1,
    ] {
        let src = f32s(&fixture(&format!("{ty}.src.f32")));
        let mut got = vec![0u8; ty.row_bytes(src.len()).unwrap()];
        quantize_row(ty, &src, &mut got).unwrap();
        assert_eq!(got, fixture(&format!("{ty}.q")), "{ty}");
    }
}

#[test]
fn the_k_quant_and_iq4_quantizers_are_byte_exact_with_ggml() {
    for ty in [
        QuantType::Q2K,
        QuantType::Q3K,
        QuantType::Q4K,
        QuantType::Q5K,
        QuantType::Q6K,
    ] {
        let src = f32s(&fixture(&format!("{ty}.ggml.src.f32")));
        let want = fixture(&format!("{ty}.ggml.q"));
        let mut got = vec![0u8; ty.row_bytes(src.len()).unwrap()];
        quantize_row(ty, &src, &mut got).unwrap();
        let differing: Vec<usize> = got
            .chunks(ty.block_bytes())
            .zip(want.chunks(ty.block_bytes()))
            .enumerate()
            .filter(|(_, (g, w))| g != w)
            .map(|(i, _)| i)
            .collect();
        assert!(
            differing.is_empty(),
            "{ty}: blocks {differing:?} of {} differ from ggml's",
            got.len() / ty.block_bytes()
        );
    }
}

/// Deterministic activations in [-1, 1).
fn activations(n: usize) -> Vec<f32> {
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

#[test]
fn matmul_matches_dequantize_then_dot() {
    let m = 3;
    for ty in QuantType::ALL {
        let (q, w) = blocks(ty);
        let rows = 4;
        let cols = w.len() / rows;
        let x = activations(m * cols);
        let matrix = QuantMatrix::new(ty, rows, cols, &q).unwrap();
        for isa in Isa::ALL.into_iter().filter(|isa| isa.is_available()) {
            for (precision, tol) in [(Precision::Exact, 1e-5), (Precision::Fast, 1e-2)] {
                let mut y = vec![f32::NAN; m * rows];
                matrix.matmul_with(isa, precision, &x, m, &mut y).unwrap();
                let mut worst = 0f64;
                for i in 0..m {
                    for r in 0..rows {
                        let (wr, xi) = (&w[r * cols..][..cols], &x[i * cols..][..cols]);
                        let dot: f64 = wr
                            .iter()
                            .zip(xi)
                            .map(|(a, b)| f64::from(*a) * f64::from(*b))
                            .sum();
                        let mag: f64 = wr
                            .iter()
                            .zip(xi)
                            .map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs())
                            .sum();
                        let err = (f64::from(y[i * rows + r]) - dot).abs() / mag.max(1e-30);
                        worst = worst.max(err);
                    }
                }
                println!("{ty} {isa:?} {precision:?}: max error / sum|w*x| = {worst:.2e}");
                assert!(
                    worst <= tol,
                    "{ty} {isa:?} {precision:?}: relative error {worst:e}"
                );
            }
        }
    }
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    assert_eq!(QuantType::from_gguf_type_id(12).unwrap(), QuantType::Q4K);
    assert_eq!(
        QuantType::from_gguf_type_id(9),
        Err(QuantError::UnsupportedTypeId(9))
    );
    assert!(QuantType::Q6K.row_bytes(100).is_err());

    let (q, _) = blocks(QuantType::Q4_0);
    let mut out = vec![0f32; 32];
    assert!(dequantize_row(QuantType::Q4_0, &q, &mut out).is_err());
    assert!(dequantize_row(QuantType::Q4_0, &q[..18], &mut out[..16]).is_err());
    assert!(QuantMatrix::new(QuantType::Q4_0, 4, 128, &q[1..]).is_err());
    assert!(QuantMatrix::new(QuantType::Q4_0, 4, 100, &q).is_err());

    let matrix = QuantMatrix::new(QuantType::Q4_0, 4, 128, &q).unwrap();
    let mut y = vec![0f32; 4];
    assert!(matrix
        .matmul(Precision::Fast, &[0.0; 127], 1, &mut y)
        .is_err());
    assert!(matrix
        .matmul(Precision::Exact, &[0.0; 128], 1, &mut y[..3])
        .is_err());
    assert!(matrix
        .matmul(Precision::Exact, &[0.0; 128], 2, &mut y)
        .is_err());
    assert!(quantize_row(QuantType::Q8_0, &[0.0; 32], &mut [0u8; 35]).is_err());
}
