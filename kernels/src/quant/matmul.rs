//! Matrix products with quantized weights: kernel selection by instruction
//! set, the activations' quantization (`acts.rs`), and splitting the rows
//! over threads (`job.rs`).

use std::sync::OnceLock;

mod acts;
mod job;
mod residual;

use super::act::{BlockQ8, BlockQ8K};
use super::aligned::Aligned;
#[cfg(target_arch = "x86_64")]
use super::avx512::amx::Int8Weights;
#[cfg(target_arch = "x86_64")]
use super::avx512::BlockQ8x2;
use super::format::{marker, Format, QK_K};
use super::{scalar, Precision, QuantError, QuantType};
use crate::cpu::CpuFeatures;
use acts::ActBlock;
use job::{Job, Panels};

/// An instruction set the quantized kernels are written for, from the most
/// portable up.
///
/// Formats without a kernel for an instruction set use the best one below it
/// (ultimately the portable one, which covers every format).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Portable Rust, on every CPU.
    Scalar,
    /// x86_64 AVX2 with FMA and F16C.
    Avx2,
    /// x86_64 AVX-512 (F, BW, VBMI, VNNI), on top of AVX2.
    Avx512,
    /// x86_64 AMX int8 tiles, on top of AVX-512: fast products of the
    /// 32-value formats, Q4_K and Q6_K over 16 activation rows or more. Not
    /// available when the environment variable `KILN_NO_AMX` is set.
    Amx,
}

impl Isa {
    /// Every instruction set, from the most portable up.
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx];

    /// The best instruction set this CPU supports (detected once).
    pub fn detect() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            Self::ALL
                .into_iter()
                .rev()
                .find(|isa| isa.is_available())
                .unwrap_or(Isa::Scalar)
        })
    }

    /// Whether this CPU supports the instruction set.
    pub fn is_available(self) -> bool {
        let f = CpuFeatures::detect();
        let avx2 = cfg!(target_arch = "x86_64") && f.avx2 && f.fma && f.f16c;
        match self {
            Isa::Scalar => true,
            Isa::Avx2 => avx2,
            Isa::Avx512 => avx2 && f.avx512 && f.avx512_vnni && f.avx512_vbmi && avx512vl(),
            Isa::Amx => Isa::Avx512.is_available() && amx_granted(),
        }
    }
}

/// Whether the CPU has AMX int8 tiles and the OS lets this process use them.
fn amx_granted() -> bool {
    #[cfg(target_arch = "x86_64")]
    return super::avx512::amx::available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the CPU has AVX-512 VL (the 128- and 256-bit forms of the
/// AVX-512 instructions, and their 32 registers), which the AVX-512 kernels
/// are compiled with. Every CPU with VBMI and VNNI has it.
fn avx512vl() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx512vl");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// A kernel: `out[r]` = the dot product of weight row `r` (of the
/// `out.len()` rows in the bytes given) with one activation row, given as f32
/// values or 8-bit blocks. Unsafe because it may need CPU features.
type Kernel<A> = unsafe fn(&[u8], &[A], &mut [f32]);

/// A kernel over several activation rows at once (a GEMM micro-kernel,
/// which decodes each weight block once for all of them): given the weight
/// rows, exactly `acts` activation rows one after another (`act_len` values
/// or blocks each) and `out` of `acts * n` values, sets `out[i * n + r]` to
/// weight row `r` times activation row `i`. It must give bit for bit what the
/// single-row kernel gives. Unsafe because it may need CPU features.
struct MultiKernel<A> {
    acts: usize,
    kernel: unsafe fn(&[u8], &[A], usize, &mut [f32]),
}

// Not derived: that would require `A: Copy`.
impl<A> Clone for MultiKernel<A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A> Copy for MultiKernel<A> {}

/// The most multi-row kernels a format has (for different numbers of
/// activation rows).
const MAX_MULTI_KERNELS: usize = 4;

/// Exact products over many activation rows from weights decoded to f32
/// once per tile of weight rows: `pack` lays out activation rows (of `cols`
/// values, the second argument) for `multiply`; `decode` turns whole weight
/// rows into f32 the same way; `multiply` is given both and writes weight
/// row `r` times activation row `i` to `outs[i][col0 + r]` (`col0` the last
/// argument). Together they must give bit for bit what the single-row
/// kernel gives. Unsafe because they may need CPU features.
#[derive(Clone, Copy)]
struct Panel {
    pack: fn(&[f32], usize, &mut [f32]),
    decode: unsafe fn(&[u8], usize, &mut [f32]),
    multiply: PanelMultiply,
    /// The fewest activation rows they take (fewer go to the other
    /// kernels).
    min_acts: usize,
    /// Bytes of f32 weights decoded at once: they stay in L2 while every
    /// activation row passes.
    tile_bytes: usize,
}

/// [`Panel`]'s `multiply`.
type PanelMultiply = unsafe fn(&[f32], &[f32], usize, &mut [&mut [f32]], usize);

/// Fast products over many activation rows from weights decoded to bytes
/// once per tile, on AMX tiles or with AVX-512 VNNI: `decode` lays out
/// whole weight rows (of `cols` values, the second argument) as B tiles,
/// `multiply` takes them with the quantized activation rows (`act_len`
/// blocks each, padded with zero blocks to a multiple of 16 rows) and
/// writes weight row `r` (of `n`, the last argument) times activation row
/// `i` to `outs[i][col0 + r]`. Together they must give bit for bit what
/// the single-row kernel gives. Unsafe because they need AMX or AVX-512.
#[cfg(target_arch = "x86_64")]
struct Int8Panel<A> {
    decode: unsafe fn(&[u8], usize, &mut Int8Weights),
    multiply: Int8Multiply<A>,
}

/// An int8 panel product: decoded weights, activation rows, blocks a row,
/// outputs, first output column, weight rows.
#[cfg(target_arch = "x86_64")]
type Int8Multiply<A> = unsafe fn(&Int8Weights, &[A], usize, &mut [&mut [f32]], usize, usize);

// Not derived: that would require `A: Copy`.
#[cfg(target_arch = "x86_64")]
impl<A> Clone for Int8Panel<A> {
    fn clone(&self) -> Self {
        *self
    }
}

#[cfg(target_arch = "x86_64")]
impl<A> Copy for Int8Panel<A> {}

/// The kernels of a format, precision and instruction set.
struct Kernels<A> {
    one: Kernel<A>,
    /// Kernels for several activation rows at once, the most rows first;
    /// the rows they leave go to `one`.
    multi: [Option<MultiKernel<A>>; MAX_MULTI_KERNELS],
}

// Not derived: that would require `A: Copy`.
impl<A> Clone for Kernels<A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A> Copy for Kernels<A> {}

/// The fewest activation rows the AVX-512 panel kernels take (fewer go to
/// the multi-row kernels: measured, 8 rows do not repay decoding a tile, 16
/// do).
#[cfg(target_arch = "x86_64")]
const PANEL_MIN_ACTS_512: usize = 16;
/// Bytes of f32 weights the AVX-512 panel kernels decode at once.
#[cfg(target_arch = "x86_64")]
const PANEL_TILE_BYTES_512: usize = 512 << 10;
/// The fewest activation rows the int8 panel kernels take (a tile holds 16).
#[cfg(target_arch = "x86_64")]
const INT8_PANEL_MIN_ACTS: usize = 16;
/// Activation rows the panel kernels take at once: the laid-out copy of a
/// slab (at most 1024 rows × `cols` f32) is what they add to memory.
const PANEL_SLAB_ROWS: usize = 1024;

/// Only a single-row kernel.
fn one<A>(one: Kernel<A>) -> Kernels<A> {
    Kernels {
        one,
        multi: [None; MAX_MULTI_KERNELS],
    }
}

/// A multi-row kernel for `acts` activation rows.
fn multi<A>(
    acts: usize,
    kernel: unsafe fn(&[u8], &[A], usize, &mut [f32]),
) -> Option<MultiKernel<A>> {
    Some(MultiKernel { acts, kernel })
}

/// The kernel for a format, precision and instruction set, with its
/// activation representation.
enum Selected {
    Exact(Kernels<f32>),
    /// Exact kernels, and panel kernels for the activation rows they take
    /// (`Panel::min_acts` or more).
    ExactPanel(Kernels<f32>, Panel),
    Q8(Kernels<BlockQ8>),
    Q8K(Kernels<BlockQ8K>),
    #[cfg(target_arch = "x86_64")]
    /// AVX-512 fast kernels, and AMX or VNNI panel ones for [`INT8_PANEL_MIN_ACTS`] activation
    /// rows or more.
    #[cfg(target_arch = "x86_64")]
    Q8x2Panel(Kernels<BlockQ8x2>, Int8Panel<BlockQ8x2>),
    /// Q8_K kernels, and AMX ones (VNNI ones for IQ4_XS) for [`INT8_PANEL_MIN_ACTS`] activation rows or
    /// more.
    #[cfg(target_arch = "x86_64")]
    Q8KPanel(Kernels<BlockQ8K>, Int8Panel<BlockQ8K>),
}

/// Evaluates `$body` with `$f` naming the [`Format`](super::format::Format)
/// marker of `$ty`.
macro_rules! with_format {
    ($ty:expr, $f:ident => $body:expr) => {
        match $ty {
            QuantType::Q4_0 => {
                type $f = marker::Q4_0;
                $body
            }
            QuantType::Q4_1 => {
                type $f = marker::Q4_1;
                $body
            }
            QuantType::Q5_0 => {
                type $f = marker::Q5_0;
                $body
            }
            QuantType::Q5_1 => {
                type $f = marker::Q5_1;
                $body
            }
            QuantType::Q8_0 => {
                type $f = marker::Q8_0;
                $body
            }
            QuantType::Q2K => {
                type $f = marker::Q2K;
                $body
            }
            QuantType::Q3K => {
                type $f = marker::Q3K;
                $body
            }
            QuantType::Q4K => {
                type $f = marker::Q4K;
                $body
            }
            QuantType::Q5K => {
                type $f = marker::Q5K;
                $body
            }
            QuantType::Q6K => {
                type $f = marker::Q6K;
                $body
            }
            QuantType::IQ4NL => {
                type $f = marker::IQ4NL;
                $body
            }
            QuantType::IQ4XS => {
                type $f = marker::IQ4XS;
                $body
            }
        }
    };
}

/// The kernels a product runs: [`Precision::FastResidual`] runs the fast
/// ones (over the activation rows and their residuals, `residual`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arithmetic {
    Exact,
    Fast,
}

fn select(ty: QuantType, precision: Arithmetic, isa: Isa) -> Selected {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        if let Some(kernel) = select_avx512(ty, precision, isa >= Isa::Amx) {
            return kernel;
        }
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        return select_avx2(ty, precision);
    }
    let _ = isa;
    with_format!(ty, F => match (precision, ty.is_k_quant()) {
        (Arithmetic::Exact, _) => Selected::Exact(one(scalar::exact::<F>)),
        (Arithmetic::Fast, false) => Selected::Q8(one(scalar::fast_q8::<F>)),
        (Arithmetic::Fast, true) => Selected::Q8K(one(scalar::fast_q8k::<F>)),
    })
}

#[cfg(target_arch = "x86_64")]
fn select_avx512(ty: QuantType, precision: Arithmetic, amx: bool) -> Option<Selected> {
    use super::avx512::Blocks32;
    use marker as m;
    use Arithmetic::{Exact, Fast};
    Some(match (precision, ty) {
        (Exact, QuantType::Q4_0) => exact_512::<Blocks32<m::Q4_0>>(),
        (Exact, QuantType::Q4_1) => exact_512::<Blocks32<m::Q4_1>>(),
        (Exact, QuantType::Q5_0) => exact_512::<Blocks32<m::Q5_0>>(),
        (Exact, QuantType::Q5_1) => exact_512::<Blocks32<m::Q5_1>>(),
        (Exact, QuantType::IQ4NL) => exact_512::<Blocks32<m::IQ4NL>>(),
        (Exact, QuantType::Q4K) => exact_512::<m::Q4K>(),
        (Exact, QuantType::Q6K) => exact_512::<m::Q6K>(),
        (Exact, QuantType::Q2K) => exact_512::<m::Q2K>(),
        (Exact, QuantType::Q3K) => exact_512::<m::Q3K>(),
        (Exact, QuantType::IQ4XS) => exact_512::<m::IQ4XS>(),
        // Exact Q8_0 keeps the AVX2 kernels: the AVX-512 one decodes a
        // single row 10-20 % slower (measured on Zen 5 and Sapphire Rapids),
        // and Q8_0 is mostly LM heads, which prefill runs for one row only
        // (batched decode runs them for every sequence: the multi-row and
        // panel ones).
        (Exact, QuantType::Q8_0) => exact_avx2::<m::Q8_0>(),
        (Fast, QuantType::Q4_0) => fast_512::<m::Q4_0>(amx),
        (Fast, QuantType::Q4_1) => fast_512::<m::Q4_1>(amx),
        (Fast, QuantType::Q5_0) => fast_512::<m::Q5_0>(amx),
        (Fast, QuantType::Q5_1) => fast_512::<m::Q5_1>(amx),
        (Fast, QuantType::Q8_0) => fast_512::<m::Q8_0>(amx),
        (Fast, QuantType::IQ4NL) => fast_512::<m::IQ4NL>(amx),
        (Fast, QuantType::Q4K) if amx => {
            use super::avx512::amx as k;
            let panel = Int8Panel {
                decode: k::decode_q4k,
                multiply: k::multiply_q4k,
            };
            Selected::Q8KPanel(fast_q45k_avx2::<m::Q4K>(), panel)
        }
        // With AMX too: IQ4_XS has no AMX kernels of its own.
        (Fast, QuantType::IQ4XS) => {
            use super::avx512::vnni as k;
            let panel = Int8Panel {
                decode: k::decode_iq4xs,
                multiply: k::multiply_iq4xs,
            };
            Selected::Q8KPanel(fast_iq4xs_avx2(), panel)
        }
        (Fast, QuantType::Q6K) if amx => {
            use super::avx512::amx as k;
            let panel = Int8Panel {
                decode: k::decode_q6k,
                multiply: k::multiply_q6k,
            };
            Selected::Q8KPanel(fast_k16_avx2::<m::Q6K>(), panel)
        }
        _ => return None,
    })
}

/// The AVX-512 exact kernels for Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K,
/// Q4_K, Q6_K and IQ4_XS:
/// the single-row one, multi-row ones for 8, 4, 3 and 2 activation rows,
/// which decode each 64 weights once for all of them, and for more rows
/// the panel kernels, which decode each weight once for all of them.
#[cfg(target_arch = "x86_64")]
fn exact_512<D: super::avx512::ExactRows>() -> Selected {
    use super::avx512 as k;
    let kernels = Kernels {
        one: k::exact::<D>,
        multi: [
            multi(8, k::exact_multi::<D, 8>),
            multi(4, k::exact_multi::<D, 4>),
            multi(3, k::exact_multi::<D, 3>),
            multi(2, k::exact_multi::<D, 2>),
        ],
    };
    let panel = Panel {
        pack: k::pack_acts,
        decode: k::decode_rows::<D>,
        multiply: k::panel_multiply,
        min_acts: PANEL_MIN_ACTS_512,
        tile_bytes: PANEL_TILE_BYTES_512,
    };
    Selected::ExactPanel(kernels, panel)
}

/// The AVX-512 fast kernels for the 32-value formats: the single-row one,
/// and multi-row ones for 8, 4 and 2 activation rows; all take 16 weight
/// rows at a time; for many activation rows the AMX kernels, or without
/// `amx` the VNNI panel kernels (`avx512::vnni`).
#[cfg(target_arch = "x86_64")]
fn fast_512<F: Format>(amx: bool) -> Selected {
    use super::avx512 as k;
    let kernels = Kernels {
        one: k::fast_32::<F>,
        multi: [
            multi(8, k::fast_32_multi::<F, 8>),
            multi(4, k::fast_32_multi::<F, 4>),
            multi(2, k::fast_32_multi::<F, 2>),
            None,
        ],
    };
    let panel = Int8Panel {
        decode: k::amx::decode_weights::<F>,
        multiply: if amx {
            k::amx::multiply::<F>
        } else {
            k::vnni::multiply::<F>
        },
    };
    Selected::Q8x2Panel(kernels, panel)
}

/// The AVX2 exact kernels of the 32-value formats and the K-quants: the
/// single-row one, multi-row ones for three and two activation rows
/// (batched decode: each weight dequantized once for all of them), and from
/// [`PANEL_MIN_ACTS_AVX2`] activation rows on the panel kernels, which
/// dequantize a tile of weights once for all of them and multiply in 6 × 2
/// register blocks.
#[cfg(target_arch = "x86_64")]
fn exact_avx2<F: Format>() -> Selected {
    use super::avx2 as k;
    let panel = Panel {
        pack: k::pack_acts,
        decode: k::decode_rows::<F>,
        multiply: k::panel_multiply,
        min_acts: PANEL_MIN_ACTS_AVX2,
        tile_bytes: PANEL_TILE_BYTES_AVX2,
    };
    let kernels = if F::ELEMS == QK_K {
        Kernels {
            one: k::exact_k::<F>,
            multi: [
                multi(3, k::exact_k_multi::<F, 3>),
                multi(2, k::exact_k_multi::<F, 2>),
                None,
                None,
            ],
        }
    } else {
        Kernels {
            one: k::exact_32::<F>,
            multi: [
                multi(3, k::exact_32_multi::<F, 3>),
                multi(2, k::exact_32_multi::<F, 2>),
                None,
                None,
            ],
        }
    };
    Selected::ExactPanel(kernels, panel)
}

/// The fewest activation rows the AVX2 exact panel kernels take (fewer go
/// to the multi-row and single-row kernels).
#[cfg(target_arch = "x86_64")]
const PANEL_MIN_ACTS_AVX2: usize = 4;

/// Bytes of f32 weights the AVX2 panel kernels decode at once.
#[cfg(target_arch = "x86_64")]
const PANEL_TILE_BYTES_AVX2: usize = 192 << 10;

/// The AVX2 fast kernels for Q4_0, Q4_1, Q5_0 and Q5_1 (Q8_0 and IQ4_NL replace the
/// single-row one): the single-row one, and multi-row ones for 8, 4 and 2
/// activation rows (8 measured best of 2 to 8).
#[cfg(target_arch = "x86_64")]
fn fast_avx2<F: Format>() -> Kernels<BlockQ8> {
    use super::avx2 as k;
    Kernels {
        one: k::fast_32::<F>,
        multi: [
            multi(8, k::fast_32_multi::<F, 8>),
            multi(4, k::fast_32_multi::<F, 4>),
            multi(2, k::fast_32_multi::<F, 2>),
            None,
        ],
    }
}

/// The AVX2 fast kernels for Q4_K and Q5_K: the single-row one, and
/// multi-row ones for 8, 4 and 2 activation rows (these formats have no
/// AVX-512 kernels, so AVX-512 machines use them too).
#[cfg(target_arch = "x86_64")]
fn fast_q45k_avx2<F: Format>() -> Kernels<BlockQ8K> {
    use super::avx2 as k;
    Kernels {
        one: k::fast_q45k::<F>,
        multi: [
            multi(8, k::fast_q45k_multi::<F, 8>),
            multi(4, k::fast_q45k_multi::<F, 4>),
            multi(2, k::fast_q45k_multi::<F, 2>),
            None,
        ],
    }
}

/// The AVX2 fast kernels for Q2_K, Q3_K and Q6_K (the formats whose scales
/// cover runs of 16 values): the single-row one, and multi-row ones for 8,
/// 4 and 2 activation rows (AVX-512 machines use them too).
#[cfg(target_arch = "x86_64")]
fn fast_k16_avx2<F: Format>() -> Kernels<BlockQ8K> {
    use super::avx2 as k;
    Kernels {
        one: k::fast_k16::<F>,
        multi: [
            multi(8, k::fast_k16_multi::<F, 8>),
            multi(4, k::fast_k16_multi::<F, 4>),
            multi(2, k::fast_k16_multi::<F, 2>),
            None,
        ],
    }
}

/// The AVX2 fast kernels for IQ4_XS: the single-row one, and multi-row
/// ones for 8, 4 and 2 activation rows (AVX-512 machines use them too).
#[cfg(target_arch = "x86_64")]
fn fast_iq4xs_avx2() -> Kernels<BlockQ8K> {
    use super::avx2 as k;
    Kernels {
        one: k::fast_iq4xs,
        multi: [
            multi(8, k::fast_iq4xs_multi::<8>),
            multi(4, k::fast_iq4xs_multi::<4>),
            multi(2, k::fast_iq4xs_multi::<2>),
            None,
        ],
    }
}

#[cfg(target_arch = "x86_64")]
fn select_avx2(ty: QuantType, precision: Arithmetic) -> Selected {
    use super::avx2 as k;
    use marker as m;
    use Arithmetic::{Exact, Fast};
    match (precision, ty) {
        (Exact, QuantType::Q4_0) => exact_avx2::<m::Q4_0>(),
        (Exact, QuantType::Q4_1) => exact_avx2::<m::Q4_1>(),
        (Exact, QuantType::Q5_0) => exact_avx2::<m::Q5_0>(),
        (Exact, QuantType::Q5_1) => exact_avx2::<m::Q5_1>(),
        (Exact, QuantType::Q8_0) => exact_avx2::<m::Q8_0>(),
        (Exact, QuantType::Q4K) => exact_avx2::<m::Q4K>(),
        (Exact, QuantType::Q5K) => exact_avx2::<m::Q5K>(),
        (Exact, QuantType::Q6K) => exact_avx2::<m::Q6K>(),
        (Exact, QuantType::Q2K) => exact_avx2::<m::Q2K>(),
        (Exact, QuantType::Q3K) => exact_avx2::<m::Q3K>(),
        (Exact, QuantType::IQ4NL) => exact_avx2::<m::IQ4NL>(),
        (Exact, QuantType::IQ4XS) => exact_avx2::<m::IQ4XS>(),
        (Fast, QuantType::Q4_0) => Selected::Q8(fast_avx2::<m::Q4_0>()),
        (Fast, QuantType::Q4_1) => Selected::Q8(fast_avx2::<m::Q4_1>()),
        (Fast, QuantType::Q5_0) => Selected::Q8(fast_avx2::<m::Q5_0>()),
        (Fast, QuantType::Q5_1) => Selected::Q8(fast_avx2::<m::Q5_1>()),
        (Fast, QuantType::Q8_0) => Selected::Q8(Kernels {
            one: k::fast_signed_32::<m::Q8_0>,
            ..fast_avx2::<m::Q8_0>()
        }),
        (Fast, QuantType::IQ4NL) => Selected::Q8(Kernels {
            one: k::fast_signed_32::<m::IQ4NL>,
            ..fast_avx2::<m::IQ4NL>()
        }),
        (Fast, QuantType::Q4K) => Selected::Q8K(fast_q45k_avx2::<m::Q4K>()),
        (Fast, QuantType::Q5K) => Selected::Q8K(fast_q45k_avx2::<m::Q5K>()),
        (Fast, QuantType::Q6K) => Selected::Q8K(fast_k16_avx2::<m::Q6K>()),
        (Fast, QuantType::Q2K) => Selected::Q8K(fast_k16_avx2::<m::Q2K>()),
        (Fast, QuantType::Q3K) => Selected::Q8K(fast_k16_avx2::<m::Q3K>()),
        (Fast, QuantType::IQ4XS) => Selected::Q8K(fast_iq4xs_avx2()),
    }
}

/// A borrowed quantized weight matrix: `rows` rows of `cols` values, each row
/// stored as `ty.row_bytes(cols)` bytes of blocks, rows one after another.
#[derive(Clone, Copy, Debug)]
pub struct QuantMatrix<'a> {
    ty: QuantType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    data: &'a [u8],
}

impl<'a> QuantMatrix<'a> {
    /// Wraps `data`, checking that `cols` is a multiple of the block size and
    /// that `data` holds exactly `rows` rows.
    pub fn new(
        ty: QuantType,
        rows: usize,
        cols: usize,
        data: &'a [u8],
    ) -> Result<Self, QuantError> {
        let row_bytes = ty.row_bytes(cols)?;
        let expected = row_bytes.checked_mul(rows).ok_or(QuantError::TooLarge)?;
        check_len("weight", expected, data.len())?;
        Ok(Self {
            ty,
            rows,
            cols,
            row_bytes,
            data,
        })
    }

    /// The block format.
    pub fn quant_type(&self) -> QuantType {
        self.ty
    }

    /// Number of rows (outputs).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns (inputs).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The quantized bytes.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// `y = x · Wᵀ` on the best instruction set: `x` is `m x cols`, `y` is
    /// `m x rows`, both row-major, and `y[i][r]` is the dot product of
    /// activation row `i` with weight row `r`.
    pub fn matmul(
        &self,
        precision: Precision,
        x: &[f32],
        m: usize,
        y: &mut [f32],
    ) -> Result<(), QuantError> {
        self.matmul_with(Isa::detect(), precision, x, m, y)
    }

    /// [`matmul`](Self::matmul) on a given instruction set (an error if the
    /// CPU lacks it); for tests and benchmarks.
    pub fn matmul_with(
        &self,
        isa: Isa,
        precision: Precision,
        x: &[f32],
        m: usize,
        y: &mut [f32],
    ) -> Result<(), QuantError> {
        check_len(
            "activation",
            m.checked_mul(self.cols).ok_or(QuantError::TooLarge)?,
            x.len(),
        )?;
        check_len(
            "output",
            m.checked_mul(self.rows).ok_or(QuantError::TooLarge)?,
            y.len(),
        )?;
        if !isa.is_available() {
            return Err(QuantError::IsaUnavailable(isa));
        }
        if self.rows == 0 || m == 0 {
            return Ok(());
        }
        if self.cols == 0 {
            y.fill(0.0);
            return Ok(());
        }
        let (arithmetic, residual) = match precision {
            Precision::Exact => (Arithmetic::Exact, false),
            Precision::Fast => (Arithmetic::Fast, false),
            Precision::FastResidual => (Arithmetic::Fast, true),
        };
        // The activation rows the fast kernels see: with residuals, twice `m`.
        #[cfg(target_arch = "x86_64")]
        let fast_rows = if residual { 2 * m } else { m };
        match select(self.ty, arithmetic, isa) {
            Selected::ExactPanel(kernels, panel) if m >= panel.min_acts => {
                // The panel kernels read the activations many times over:
                // laid out, from a copy that starts on a cache line, so that
                // no 64-byte load straddles two. By slabs of rows, so that
                // the copy stays small beside `x`.
                let mut packed = Aligned::default();
                let slabs = x
                    .chunks(PANEL_SLAB_ROWS * self.cols)
                    .zip(y.chunks_mut(PANEL_SLAB_ROWS * self.rows));
                for (x, y) in slabs {
                    let packed = packed.floats(x.len());
                    (panel.pack)(x, self.cols, packed);
                    let job = Job {
                        panel: Some(Panels::Exact(panel, packed)),
                        ..self.job(kernels, x, self.cols)
                    };
                    job.run(self.rows, y);
                }
            }
            Selected::Exact(kernels) | Selected::ExactPanel(kernels, _) => {
                self.job(kernels, x, self.cols).run(self.rows, y)
            }
            Selected::Q8(kernels) => self.run_quantized(isa, kernels, 1, x, residual, y),
            Selected::Q8K(kernels) => self.run_quantized(isa, kernels, 1, x, residual, y),
            #[cfg(target_arch = "x86_64")]
            Selected::Q8KPanel(kernels, amx) if fast_rows >= INT8_PANEL_MIN_ACTS => {
                self.run_int8_panel(isa, kernels, amx, x, residual, y)
            }
            #[cfg(target_arch = "x86_64")]
            Selected::Q8KPanel(kernels, _) => self.run_quantized(isa, kernels, 1, x, residual, y),
            #[cfg(target_arch = "x86_64")]
            Selected::Q8x2Panel(kernels, amx) if fast_rows >= INT8_PANEL_MIN_ACTS => {
                self.run_int8_panel(isa, kernels, amx, x, residual, y)
            }
            #[cfg(target_arch = "x86_64")]
            Selected::Q8x2Panel(kernels, _) => {
                self.run_quantized(isa, kernels, super::avx512::LANES, x, residual, y)
            }
        }
        Ok(())
    }

    /// Quantizes the activations `x` to blocks `A` (with their residuals,
    /// if `residual`) and runs `kernels`, tasks taking multiples of
    /// `row_align` rows.
    fn run_quantized<A: ActBlock>(
        &self,
        isa: Isa,
        kernels: Kernels<A>,
        row_align: usize,
        x: &[f32],
        residual: bool,
        y: &mut [f32],
    ) {
        let (acts, per_row) = residual::quantize_rows::<A>(isa, x, self.cols, 1, residual);
        let job = Job {
            row_align,
            ..self.job(kernels, &acts, per_row)
        };
        residual::run(&job, self.rows, residual, y);
    }

    /// As [`run_quantized`](Self::run_quantized), every row on the int8 panel
    /// kernels, the activation rows padded to a multiple of 16.
    #[cfg(target_arch = "x86_64")]
    fn run_int8_panel<A: ActBlock>(
        &self,
        isa: Isa,
        kernels: Kernels<A>,
        amx: Int8Panel<A>,
        x: &[f32],
        residual: bool,
        y: &mut [f32],
    ) {
        let lanes = super::avx512::LANES;
        let (acts, per_row) = residual::quantize_rows::<A>(isa, x, self.cols, lanes, residual);
        let job = Job {
            panel: Some(Panels::Int8(amx, self.cols)),
            row_align: lanes,
            ..self.job(kernels, &acts, per_row)
        };
        residual::run(&job, self.rows, residual, y);
    }

    fn job<'j, A>(&'j self, kernels: Kernels<A>, acts: &'j [A], act_len: usize) -> Job<'j, A> {
        debug_assert!(kernels.multi.iter().flatten().all(|k| k.acts >= 2));
        Job {
            kernel: kernels.one,
            multi: kernels.multi,
            panel: None,
            row_align: 1,
            weight: self.data,
            row_bytes: self.row_bytes,
            acts,
            act_len,
        }
    }
}

pub(super) fn check_len(
    what: &'static str,
    expected: usize,
    actual: usize,
) -> Result<(), QuantError> {
    if expected == actual {
        Ok(())
    } else {
        Err(QuantError::WrongLength {
            what,
            expected,
            actual,
        })
    }
}
