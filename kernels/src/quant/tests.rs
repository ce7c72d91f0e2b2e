//! Every kernel on every available instruction set against the dequantized
//! reference, in both precisions.

use half::f16;

use super::act::quantize_run;
use super::*;

/// splitmix64: a tiny deterministic generator for test data.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub(crate) fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Random blocks: random quant bytes, scales of moderate magnitude.
fn random_blocks(ty: QuantType, blocks: usize, rng: &mut Rng) -> Vec<u8> {
    let mut data: Vec<u8> = (0..blocks * ty.block_bytes())
        .map(|_| rng.next_u64() as u8)
        .collect();
    for block in data.chunks_exact_mut(ty.block_bytes()) {
        for &at in ty.f16_fields() {
            let v = f16::from_f32(rng.f32() * 0.05);
            block[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    data
}

fn dequantize_matrix(ty: QuantType, data: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * cols];
    let rb = ty.row_bytes(cols).unwrap();
    for (src, dst) in data.chunks_exact(rb).zip(out.chunks_exact_mut(cols)) {
        dequantize_row(ty, src, dst).unwrap();
    }
    out
}

/// The activations as the fast kernels see them: quantized per block of 32
/// (256 for K-quants) and dequantized.
fn quantized_activations(ty: QuantType, x: &[f32]) -> Vec<f32> {
    let n = if ty.is_k_quant() { 256 } else { 32 };
    let mut qs = vec![0i8; n];
    let mut out = Vec::with_capacity(x.len());
    for run in x.chunks_exact(n) {
        let d = quantize_run(run, &mut qs);
        out.extend(qs.iter().map(|&q| d * f32::from(q)));
    }
    out
}

/// `y[i][r] = Σ w[r][k] x[i][k]` in f64, with `Σ |w x|` for the tolerance.
fn reference(w: &[f32], x: &[f32], rows: usize, cols: usize, m: usize) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0f64; m * rows];
    let mut mag = vec![0f64; m * rows];
    for i in 0..m {
        for r in 0..rows {
            let (wr, xi) = (&w[r * cols..][..cols], &x[i * cols..][..cols]);
            for (a, b) in wr.iter().zip(xi) {
                y[i * rows + r] += f64::from(*a) * f64::from(*b);
                mag[i * rows + r] += (f64::from(*a) * f64::from(*b)).abs();
            }
        }
    }
    (y, mag)
}

fn assert_close(label: &str, got: &[f32], want: &[f64], mag: &[f64], tol: f64) {
    for (k, ((g, w), s)) in got.iter().zip(want).zip(mag).enumerate() {
        let err = (f64::from(*g) - w).abs();
        assert!(
            err <= tol * s.max(1e-12),
            "{label}: y[{k}] = {g}, expected {w} (error {err:e}, scale {s:e})"
        );
    }
}

fn check_type(ty: QuantType, rows: usize, cols: usize, m: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    let data = random_blocks(ty, rows * cols / ty.block_elems(), &mut rng);
    let x: Vec<f32> = (0..m * cols).map(|_| rng.f32()).collect();
    let w = dequantize_matrix(ty, &data, rows, cols);
    let (exact, mag) = reference(&w, &x, rows, cols, m);
    let (fast, fast_mag) = reference(&w, &quantized_activations(ty, &x), rows, cols, m);
    let matrix = QuantMatrix::new(ty, rows, cols, &data).unwrap();
    let run = |isa, precision| {
        let mut y = vec![f32::NAN; m * rows];
        matrix.matmul_with(isa, precision, &x, m, &mut y).unwrap();
        y
    };
    let widen = |y: &[f32]| y.iter().map(|&v| f64::from(v)).collect::<Vec<_>>();
    let scalar_exact = widen(&run(Isa::Scalar, Precision::Exact));
    let scalar_fast = widen(&run(Isa::Scalar, Precision::Fast));
    for isa in Isa::ALL.into_iter().filter(|isa| isa.is_available()) {
        let label = format!("{ty} {isa:?} exact {rows}x{cols} m={m}");
        let y = run(isa, Precision::Exact);
        assert_close(&label, &y, &exact, &mag, 1e-5);
        assert_close(&format!("{label} vs scalar"), &y, &scalar_exact, &mag, 1e-5);

        let label = format!("{ty} {isa:?} fast {rows}x{cols} m={m}");
        let y = run(isa, Precision::Fast);
        // The same arithmetic as the reference on the quantized activations
        // (and as the portable kernel)...
        assert_close(&label, &y, &fast, &fast_mag, 1e-5);
        assert_close(
            &format!("{label} vs scalar"),
            &y,
            &scalar_fast,
            &fast_mag,
            1e-5,
        );
        // ...which is close to the exact product.
        assert_close(&label, &y, &exact, &mag, 2e-2);
    }
}

#[test]
fn every_type_and_isa_matches_the_reference() {
    for (seed, ty) in QuantType::ALL.into_iter().enumerate() {
        let cols = 2 * ty.block_elems().max(256);
        check_type(ty, 13, cols, 1, seed as u64);
        check_type(ty, 5, cols, 3, 100 + seed as u64);
        // Odd block counts (the AVX-512 kernels work on pairs of blocks).
        let elems = ty.block_elems();
        check_type(ty, 6, 3 * elems, 2, 400 + seed as u64);
        check_type(ty, 3, elems, 1, 500 + seed as u64);
    }
}

#[test]
fn threaded_products_match_the_reference() {
    for (seed, ty) in [
        QuantType::Q4_0,
        QuantType::Q8_0,
        QuantType::Q4K,
        QuantType::Q6K,
    ]
    .into_iter()
    .enumerate()
    {
        check_type(ty, 700, 1024, 1, 200 + seed as u64);
        check_type(ty, 150, 512, 5, 300 + seed as u64);
    }
}

#[test]
fn extreme_quants_do_not_overflow() {
    // All-ones quant bytes give each format's largest quants; activations of
    // one sign make every product add up.
    for ty in QuantType::ALL {
        let mut data = vec![0xFFu8; 4 * ty.block_bytes()];
        for block in data.chunks_exact_mut(ty.block_bytes()) {
            for &at in ty.f16_fields() {
                block[at..at + 2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
            }
        }
        let cols = ty.block_elems();
        let x = vec![1.0f32; cols];
        let w = dequantize_matrix(ty, &data, 4, cols);
        let (exact, mag) = reference(&w, &x, 4, cols, 1);
        let matrix = QuantMatrix::new(ty, 4, cols, &data).unwrap();
        for isa in Isa::ALL.into_iter().filter(|isa| isa.is_available()) {
            for precision in [Precision::Exact, Precision::Fast] {
                let mut y = vec![0f32; 4];
                matrix.matmul_with(isa, precision, &x, 1, &mut y).unwrap();
                assert_close(
                    &format!("{ty} {isa:?} {precision:?}"),
                    &y,
                    &exact,
                    &mag,
                    1e-5,
                );
            }
        }
    }
}

#[test]
fn simd_activation_quantization_is_identical() {
    #[cfg(target_arch = "x86_64")]
    if Isa::Avx2.is_available() {
        let mut rng = Rng::new(7);
        for scale in [0.0f32, 1e-3, 1.0, 300.0] {
            let x: Vec<f32> = (0..512).map(|_| rng.f32() * scale).collect();
            let (mut a, mut b) = (vec![0i8; 512], vec![0i8; 512]);
            let da = quantize_run(&x, &mut a);
            // SAFETY: AVX2 is available.
            let db = unsafe { super::avx2::quantize_run(&x, &mut b) };
            assert_eq!((da, &a), (db, &b));
        }
    }
}

#[test]
fn empty_and_degenerate_shapes() {
    let ty = QuantType::Q4_0;
    let m = QuantMatrix::new(ty, 0, 64, &[]).unwrap();
    m.matmul(Precision::Fast, &[0.0; 128], 2, &mut []).unwrap();
    let m = QuantMatrix::new(ty, 3, 0, &[]).unwrap();
    let mut y = [f32::NAN; 6];
    m.matmul(Precision::Exact, &[], 2, &mut y).unwrap();
    assert_eq!(y, [0.0; 6]);
}

#[test]
fn bad_shapes_are_errors() {
    let ty = QuantType::Q8_0;
    let data = vec![0u8; 2 * 34];
    assert!(matches!(
        QuantMatrix::new(ty, 2, 48, &data),
        Err(QuantError::UnalignedCols { .. })
    ));
    assert!(matches!(
        QuantMatrix::new(ty, 3, 32, &data),
        Err(QuantError::WrongLength { .. })
    ));
    assert_eq!(
        QuantMatrix::new(ty, usize::MAX, 32, &data).unwrap_err(),
        QuantError::TooLarge
    );
    let m = QuantMatrix::new(ty, 2, 32, &data).unwrap();
    let mut y = [0f32; 2];
    assert!(m.matmul(Precision::Exact, &[0.0; 31], 1, &mut y).is_err());
    assert!(m
        .matmul(Precision::Exact, &[0.0; 32], 1, &mut y[..1])
        .is_err());
    assert!(m
        .matmul(Precision::Fast, &[0.0; 32], usize::MAX, &mut y)
        .is_err());
    let mut out = [0f32; 32];
    assert!(dequantize_row(ty, &data, &mut out).is_err());
    assert!(dequantize_row(ty, &data[..34], &mut out[..31]).is_err());
}

/// The 32-value formats, which have multi-row (GEMM) kernels.
#[cfg(target_arch = "x86_64")]
const BLOCK32_TYPES: [QuantType; 6] = [
    QuantType::Q4_0,
    QuantType::Q4_1,
    QuantType::Q5_0,
    QuantType::Q5_1,
    QuantType::Q8_0,
    QuantType::IQ4NL,
];

/// The 256-value formats with multi-row (GEMM) kernels (AVX2, also used on
/// AVX-512).
#[cfg(target_arch = "x86_64")]
const MULTI_K_TYPES: [QuantType; 6] = [
    QuantType::Q2K,
    QuantType::Q3K,
    QuantType::Q4K,
    QuantType::Q5K,
    QuantType::Q6K,
    QuantType::IQ4XS,
];

/// Whether the CPU runs the kernels of `isa`; prints why a test (or part of
/// it) is skipped if not.
#[cfg(target_arch = "x86_64")]
fn available_or_skip(isa: Isa, test: &str) -> bool {
    let ok = isa.is_available();
    if !ok {
        let needs = match isa {
            Isa::Avx512 => "AVX-512 (F, BW, VBMI, VNNI)",
            Isa::Amx => "AMX int8 tiles (or the OS did not grant their state)",
            _ => "AVX2, FMA and F16C",
        };
        println!("{test}: {isa:?} part skipped, this CPU lacks {needs}");
    }
    ok
}

/// `m` activation rows at once (the multi-row kernels, and the single-row
/// kernel for the rows left over; the panel kernels from their fewest rows
/// on) give bit for bit what `m` products of one row each give (the
/// single-row kernel only), in every precision.
#[cfg(target_arch = "x86_64")]
#[test]
fn multi_row_products_equal_single_row_products() {
    let mut seed = 1000;
    for isa in [Isa::Avx2, Isa::Avx512] {
        if !available_or_skip(isa, "multi_row_products_equal_single_row_products") {
            continue;
        }
        for ty in BLOCK32_TYPES.into_iter().chain(MULTI_K_TYPES) {
            // Odd and even block counts; SmolLM2's and Gemma-3's widths (for
            // the K-quants, Gemma-3's 1024 and 2048).
            let block_counts: &[usize] = if ty.is_k_quant() {
                &[1, 2, 3, 4, 8]
            } else {
                &[1, 2, 3, 5, 18, 20]
            };
            for &blocks in block_counts {
                let cols = blocks * ty.block_elems();
                // Partial tiles of 8 rows, odd row counts, and a count big
                // enough to be split over threads.
                for (rows, ms) in [
                    (1, &[1, 2, 3, 4, 5, 9][..]),
                    (3, &[2, 4, 5, 9, 64][..]),
                    (8, &[4, 9][..]),
                    (13, &[1, 2, 3, 4, 5, 9, 64][..]),
                    (150, &[7, 64][..]),
                ] {
                    for &m in ms {
                        seed += 1;
                        check_multi_row(isa, ty, rows, cols, m, seed);
                    }
                }
            }
        }
    }
}

/// The AVX-512 exact panel kernels (16 activation rows or more) give bit
/// for bit what one row at a time gives: activation groups of 6 and every
/// remainder, weight groups of 4 and every remainder, rows in several runs
/// (longer than 1536 values, an odd last block of 32), tasks of several
/// decoded tiles (600 rows of 2048 values: 64 rows a tile, 75 rows a task
/// on 2 threads) and several slabs of activation rows (1031).
#[cfg(target_arch = "x86_64")]
#[test]
fn panel_products_equal_single_row_products() {
    if !available_or_skip(Isa::Avx512, "panel_products_equal_single_row_products") {
        return;
    }
    let mut seed = 5000;
    for ty in [
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q5_1,
    ] {
        for (rows, blocks, ms) in [
            (7, 2, &[16, 17, 18, 19, 20, 21][..]),
            (13, 20, &[22, 64][..]),
            (6, 71, &[16, 23][..]),
            // Two slabs of activation rows, the second of 7.
            (5, 2, &[1031][..]),
        ] {
            for &m in ms {
                seed += 1;
                check_multi_row(Isa::Avx512, ty, rows, blocks * 32, m, seed);
            }
        }
    }
    for ty in [
        QuantType::Q2K,
        QuantType::Q3K,
        QuantType::Q4K,
        QuantType::Q6K,
    ] {
        for (rows, blocks, m) in [(5, 1, 17), (9, 7, 19), (600, 8, 16)] {
            seed += 1;
            check_multi_row(Isa::Avx512, ty, rows, blocks * 256, m, seed);
        }
    }
}

/// The AVX2 exact panel kernels (four activation rows or more: weights
/// dequantized once, the dense register blocks) of the 32-value formats and
/// the K-quants give bit for bit what one row at a time gives (four weight
/// rows at a time, then one): every remainder of the blocks' six activation
/// rows and of their two to four weight rows, tasks of several decoded tiles
/// (600 rows of 2048 values: 24 rows a tile) and several slabs of
/// activation rows (1031).
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_panel_products_equal_single_row_products() {
    if !available_or_skip(Isa::Avx2, "avx2_panel_products_equal_single_row_products") {
        return;
    }
    let mut seed = 6000;
    for ty in BLOCK32_TYPES.into_iter().chain(MULTI_K_TYPES) {
        // Row lengths in blocks of 32, rounded up to whole super-blocks
        // for the K-quants.
        for (rows, blocks, ms) in [
            (7, 2usize, &[4, 5, 6, 7, 8, 9, 11][..]),
            (13, 20, &[12, 64][..]),
            (6, 71, &[4, 23][..]),
            (600, 64, &[8][..]),
            // Two slabs of activation rows, the second of 7.
            (5, 2, &[1031][..]),
        ] {
            let cols = (blocks * 32).next_multiple_of(ty.block_elems());
            for &m in ms {
                seed += 1;
                check_multi_row(Isa::Avx2, ty, rows, cols, m, seed);
            }
        }
    }
}

/// The int8 panel kernels (fast products of 16 activation rows or more: AMX,
/// and AVX-512 VNNI where AMX is not used) give bit for bit what the
/// AVX-512 single-row kernel gives: partial tiles of activation rows and of
/// weight rows, odd block counts, and tasks of several decoded weight tiles
/// (50 rows of 16384 values: 16 rows a tile).
#[cfg(target_arch = "x86_64")]
#[test]
fn int8_panel_products_equal_single_row_products() {
    let mut seed = 7000;
    for isa in [Isa::Avx512, Isa::Amx] {
        if !available_or_skip(isa, "int8_panel_products_equal_single_row_products") {
            continue;
        }
        int8_panels_of_32_value_formats(isa, &mut seed);
        // IQ4_XS's VNNI kernels, which AMX machines use too; the K-quants'
        // AMX ones.
        let super_blocks: &[QuantType] = if isa == Isa::Amx {
            &[QuantType::Q4K, QuantType::Q6K, QuantType::IQ4XS]
        } else {
            &[QuantType::IQ4XS]
        };
        for (rows, blocks, ms) in [
            (1, 1, &[16, 17][..]),
            (15, 2, &[16, 33][..]),
            (33, 3, &[17, 64][..]),
            (70, 19, &[20][..]),
        ] {
            for &m in ms {
                seed += 1;
                for &ty in super_blocks {
                    check_multi_row(isa, ty, rows, blocks * 256, m, seed);
                }
            }
        }
    }
}

/// [`int8_panel_products_equal_single_row_products`] for the 32-value formats
/// on `isa`'s panel kernels.
#[cfg(target_arch = "x86_64")]
fn int8_panels_of_32_value_formats(isa: Isa, seed: &mut u64) {
    for ty in BLOCK32_TYPES {
        for (rows, blocks, ms) in [
            (1, 1, &[16, 17][..]),
            (15, 3, &[16, 31, 33][..]),
            (17, 2, &[32, 47][..]),
            (33, 71, &[16, 64][..]),
            (600, 18, &[20][..]),
            (50, 512, &[17][..]),
        ] {
            for &m in ms {
                *seed += 1;
                check_multi_row(isa, ty, rows, blocks * 32, m, *seed);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn check_multi_row(isa: Isa, ty: QuantType, rows: usize, cols: usize, m: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    let data = random_blocks(ty, rows * cols / ty.block_elems(), &mut rng);
    let x: Vec<f32> = (0..m * cols).map(|_| rng.f32()).collect();
    let matrix = QuantMatrix::new(ty, rows, cols, &data).unwrap();
    let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for precision in [Precision::Fast, Precision::FastResidual, Precision::Exact] {
        let mut y = vec![f32::NAN; m * rows];
        matrix.matmul_with(isa, precision, &x, m, &mut y).unwrap();
        for (i, (x, y)) in x.chunks_exact(cols).zip(y.chunks_exact(rows)).enumerate() {
            let mut one = vec![f32::NAN; rows];
            matrix.matmul_with(isa, precision, x, 1, &mut one).unwrap();
            assert_eq!(
                bits(y),
                bits(&one),
                "{ty} {isa:?} {precision:?} {rows}x{cols} m={m}: activation row {i}"
            );
        }
    }
}

/// A multi-row kernel's signature: weights, activation rows, blocks per
/// activation row, outputs.
#[cfg(target_arch = "x86_64")]
type MultiKernel<A> = unsafe fn(&[u8], &[A], usize, &mut [f32]);

/// Runs `multi` (over `r` activation rows) against `one` (the single-row
/// kernel) on random weights of `blocks` blocks a row and 0 to 9, 16, 17
/// and 33 rows (the AVX-512 fast kernels take 16 at a time),
/// requiring equal bits. `quantize` fills a row's activation blocks.
#[cfg(target_arch = "x86_64")]
fn check_multi_kernel<A: Copy + Default>(
    ty: QuantType,
    rng: &mut Rng,
    blocks: usize,
    act_len: usize,
    (r, multi): (usize, MultiKernel<A>),
    one: unsafe fn(&[u8], &[A], &mut [f32]),
    quantize: impl Fn(&[f32], &mut [A]),
) {
    for rows in (0..=9).chain([16, 17, 33]) {
        let data = random_blocks(ty, rows * blocks, rng);
        let cols = blocks * ty.block_elems();
        let x: Vec<f32> = (0..r * cols).map(|_| rng.f32()).collect();
        let mut acts = vec![A::default(); r * act_len];
        for (x, a) in x.chunks_exact(cols).zip(acts.chunks_exact_mut(act_len)) {
            quantize(x, a);
        }
        let mut got = vec![f32::NAN; r * rows];
        // SAFETY: the caller checked the instruction set; whole rows of
        // weights and activations.
        unsafe { multi(&data, &acts, act_len, &mut got) };
        for (i, a) in acts.chunks_exact(act_len).enumerate() {
            let mut want = vec![f32::NAN; rows];
            // SAFETY: as above.
            unsafe { one(&data, a, &mut want) };
            for (k, (g, w)) in got[i * rows..][..rows].iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{ty} {r} activation rows, {rows} rows of {blocks} blocks: \
                     y[{i}][{k}] = {g}, expected {w}"
                );
            }
        }
    }
}

/// Every shape of the AVX-512 multi-row kernel (weight rows × activation
/// rows per step), whichever one `matmul` picks, against the single-row
/// kernel, bit for bit.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_multi_row_kernels_equal_the_single_row_kernel() {
    use super::avx512::{fast_32, fast_32_multi, BlockQ8x2};
    use super::format::{marker as m, Format};

    fn check<F: Format>(seed: u64) {
        let shapes: [(usize, MultiKernel<BlockQ8x2>); 4] = [
            (2, fast_32_multi::<F, 2>),
            (3, fast_32_multi::<F, 3>),
            (4, fast_32_multi::<F, 4>),
            (8, fast_32_multi::<F, 8>),
        ];
        let mut rng = Rng::new(seed);
        let quantize = |x: &[f32], a: &mut [BlockQ8x2]| {
            for (x, a) in x.chunks(64).zip(a) {
                // SAFETY: AVX-512 (and so AVX2) is available.
                unsafe { BlockQ8x2::quantize(x, a) };
            }
        };
        for blocks in [1usize, 2, 3, 7, 20] {
            for shape in shapes {
                let act_len = blocks.div_ceil(2);
                check_multi_kernel(
                    F::TY,
                    &mut rng,
                    blocks,
                    act_len,
                    shape,
                    fast_32::<F>,
                    quantize,
                );
            }
        }
    }

    if !available_or_skip(
        Isa::Avx512,
        "avx512_multi_row_kernels_equal_the_single_row_kernel",
    ) {
        return;
    }
    check::<m::Q4_0>(1);
    check::<m::Q4_1>(2);
    check::<m::Q5_0>(3);
    check::<m::Q5_1>(4);
    check::<m::Q8_0>(5);
    check::<m::IQ4NL>(6);
}

/// The AVX-512 exact multi-row kernels against the single-row one, bit for
/// bit, and the single-row one against the f64 reference (every format the
/// kernels decode, those `select` does not pick for them included).
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_exact_multi_row_kernels_equal_the_single_row_kernel() {
    use super::avx512::{exact, exact_multi, Blocks32, ExactRows};
    use super::format::marker as m;

    fn check<D: ExactRows>(ty: QuantType, seed: u64) {
        let mut rng = Rng::new(seed);
        for blocks in [1usize, 2, 3, 18] {
            let (rows, cols) = (5, blocks * D::BLOCK_VALUES);
            let data = random_blocks(ty, rows * blocks, &mut rng);
            let x: Vec<f32> = (0..cols).map(|_| rng.f32()).collect();
            let mut y = vec![f32::NAN; rows];
            // SAFETY: the caller checked that the CPU has AVX-512.
            unsafe { exact::<D>(&data, &x, &mut y) };
            let w = dequantize_matrix(ty, &data, rows, cols);
            let (want, mag) = reference(&w, &x, rows, cols, 1);
            assert_close(
                &format!("{ty} exact {blocks} blocks"),
                &y,
                &want,
                &mag,
                1e-5,
            );
        }
        let shapes: [(usize, MultiKernel<f32>); 4] = [
            (2, exact_multi::<D, 2>),
            (3, exact_multi::<D, 3>),
            (4, exact_multi::<D, 4>),
            (8, exact_multi::<D, 8>),
        ];
        let mut rng = Rng::new(seed);
        // 71 blocks of 32 values cross two 1024-value activation runs and
        // end in an odd block.
        for blocks in [1usize, 2, 3, 7, 18, 71] {
            for shape in shapes {
                check_multi_kernel(
                    ty,
                    &mut rng,
                    blocks,
                    blocks * D::BLOCK_VALUES,
                    shape,
                    exact::<D>,
                    |x: &[f32], a: &mut [f32]| a.copy_from_slice(x),
                );
            }
        }
    }

    if !available_or_skip(
        Isa::Avx512,
        "avx512_exact_multi_row_kernels_equal_the_single_row_kernel",
    ) {
        return;
    }
    check::<Blocks32<m::Q4_0>>(QuantType::Q4_0, 11);
    check::<Blocks32<m::Q4_1>>(QuantType::Q4_1, 12);
    check::<Blocks32<m::Q5_0>>(QuantType::Q5_0, 13);
    check::<Blocks32<m::Q5_1>>(QuantType::Q5_1, 14);
    check::<Blocks32<m::Q8_0>>(QuantType::Q8_0, 15);
    check::<m::Q4K>(QuantType::Q4K, 16);
    check::<m::Q6K>(QuantType::Q6K, 17);
    check::<m::Q2K>(QuantType::Q2K, 20);
    check::<m::Q3K>(QuantType::Q3K, 21);
    check::<Blocks32<m::IQ4NL>>(QuantType::IQ4NL, 18);
    check::<m::IQ4XS>(QuantType::IQ4XS, 19);
}

/// The AVX2 multi-row kernels against the single-row ones, bit for bit.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_multi_row_kernels_equal_the_single_row_kernel() {
    use super::act::BlockQ8;
    use super::avx2::{fast_32, fast_32_multi, fast_signed_32};
    use super::format::{marker as m, Format};

    fn check<F: Format>(seed: u64) {
        let shapes: [(usize, MultiKernel<BlockQ8>); 5] = [
            (2, fast_32_multi::<F, 2>),
            (3, fast_32_multi::<F, 3>),
            (4, fast_32_multi::<F, 4>),
            (6, fast_32_multi::<F, 6>),
            (8, fast_32_multi::<F, 8>),
        ];
        // Q8_0's and IQ4_NL's single-row kernel is `fast_signed_32`.
        let signed = matches!(F::TY, QuantType::Q8_0 | QuantType::IQ4NL);
        let one: unsafe fn(&[u8], &[BlockQ8], &mut [f32]) = if signed {
            fast_signed_32::<F>
        } else {
            fast_32::<F>
        };
        let mut rng = Rng::new(seed);
        let quantize = |x: &[f32], a: &mut [BlockQ8]| {
            for (x, a) in x.chunks_exact(32).zip(a) {
                let d = quantize_run(x, &mut a.qs);
                a.finish(d);
            }
        };
        for blocks in [1usize, 2, 3, 7, 20] {
            for shape in shapes {
                check_multi_kernel(F::TY, &mut rng, blocks, blocks, shape, one, quantize);
            }
        }
    }

    if !available_or_skip(
        Isa::Avx2,
        "avx2_multi_row_kernels_equal_the_single_row_kernel",
    ) {
        return;
    }
    check::<m::Q4_0>(11);
    check::<m::Q4_1>(12);
    check::<m::Q5_0>(13);
    check::<m::Q5_1>(14);
    check::<m::Q8_0>(15);
    check::<m::IQ4NL>(16);
}

/// The AVX2 multi-row kernels of the K-quants (Q2_K to Q6_K) and IQ4_XS
/// against the single-row ones, bit for bit.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_k_quant_multi_row_kernels_equal_the_single_row_kernel() {
    use super::act::BlockQ8K;
    use super::avx2::{
        fast_iq4xs, fast_iq4xs_multi, fast_k16, fast_k16_multi, fast_q45k, fast_q45k_multi,
    };
    use super::format::{marker as m, Format};

    fn check<F: Format>(
        seed: u64,
        one: unsafe fn(&[u8], &[BlockQ8K], &mut [f32]),
        shapes: &[(usize, MultiKernel<BlockQ8K>)],
    ) {
        let mut rng = Rng::new(seed);
        let quantize = |x: &[f32], a: &mut [BlockQ8K]| {
            for (x, a) in x.chunks_exact(256).zip(a) {
                let d = quantize_run(x, &mut a.qs);
                a.finish(d);
            }
        };
        for blocks in [1usize, 2, 3, 8] {
            for &shape in shapes {
                check_multi_kernel(F::TY, &mut rng, blocks, blocks, shape, one, quantize);
            }
        }
    }

    if !available_or_skip(
        Isa::Avx2,
        "avx2_k_quant_multi_row_kernels_equal_the_single_row_kernel",
    ) {
        return;
    }
    fn q45k<F: Format>(seed: u64) {
        check::<F>(
            seed,
            fast_q45k::<F>,
            &[
                (2, fast_q45k_multi::<F, 2>),
                (4, fast_q45k_multi::<F, 4>),
                (6, fast_q45k_multi::<F, 6>),
                (8, fast_q45k_multi::<F, 8>),
            ],
        );
    }
    q45k::<m::Q4K>(21);
    q45k::<m::Q5K>(22);
    fn k16<F: Format>(seed: u64) {
        check::<F>(
            seed,
            fast_k16::<F>,
            &[
                (2, fast_k16_multi::<F, 2>),
                (3, fast_k16_multi::<F, 3>),
                (4, fast_k16_multi::<F, 4>),
                (6, fast_k16_multi::<F, 6>),
                (8, fast_k16_multi::<F, 8>),
            ],
        );
    }
    k16::<m::Q6K>(23);
    k16::<m::Q2K>(25);
    k16::<m::Q3K>(26);
    check::<m::IQ4XS>(
        24,
        fast_iq4xs,
        &[
            (2, fast_iq4xs_multi::<2>),
            (3, fast_iq4xs_multi::<3>),
            (4, fast_iq4xs_multi::<4>),
            (8, fast_iq4xs_multi::<8>),
        ],
    );
}

/// [`Precision::FastResidual`] carries what the 8-bit quantization loses:
/// on activations with outliers (one large value a block of 32, as a gated
/// MLP's down projection gets), its largest error from the f64 reference
/// (relative to `Σ |w·x|`) is at least 30 times below [`Precision::Fast`]'s
/// (measured: 149 times or more), on every instruction set (one and 17
/// activation rows: the AVX-512 kernels and, with the residual rows, the AMX
/// ones).
#[test]
fn residual_products_carry_what_8_bits_lose() {
    let mut rng = Rng::new(9000);
    for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx] {
        if !available_or_skip(isa, "residual_products_carry_what_8_bits_lose") {
            continue;
        }
        for ty in [
            QuantType::Q4_1,
            QuantType::Q5_0,
            QuantType::Q8_0,
            QuantType::Q2K,
            QuantType::Q3K,
            QuantType::Q4K,
            QuantType::Q6K,
        ] {
            let (rows, cols) = (19, 512);
            let data = random_blocks(ty, rows * cols / ty.block_elems(), &mut rng);
            let w = dequantize_matrix(ty, &data, rows, cols);
            let matrix = QuantMatrix::new(ty, rows, cols, &data).unwrap();
            for m in [1, 17] {
                let x: Vec<f32> = (0..m * cols)
                    .map(|k| {
                        if k % 32 == 7 {
                            40.0 * rng.f32()
                        } else {
                            rng.f32()
                        }
                    })
                    .collect();
                let (want, mag) = reference(&w, &x, rows, cols, m);
                let error = |precision| {
                    let mut y = vec![f32::NAN; m * rows];
                    matrix.matmul_with(isa, precision, &x, m, &mut y).unwrap();
                    y.iter()
                        .zip(&want)
                        .zip(&mag)
                        .map(|((g, w), s)| (f64::from(*g) - w).abs() / s)
                        .fold(0f64, f64::max)
                };
                let (fast, residual) = (error(Precision::Fast), error(Precision::FastResidual));
                assert!(
                    residual * 30.0 < fast,
                    "{ty} {isa:?} m={m}: residual error {residual:e}, fast {fast:e}"
                );
            }
        }
    }
}
