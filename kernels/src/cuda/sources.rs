//! The hand-written CUDA C sources, embedded in the binary. Each is a real
//! `.cu` file under `kernels/cuda/` that includes `kiln_cuda.cuh` (and
//! `gguf_blocks.cuh` where it reads GGUF blocks (and `gguf_low_bits.cuh`
//! for Q2_K and Q3_K), `dense_rows.cuh` where it
//! streams rows of dense weights, `gemv.cuh` for the decode GEMVs,
//! `paged_attention.cuh` for attention over the paged cache); the
//! includes are inlined
//! before compiling, so no CUDA toolkit headers are needed at run time.

/// The shared header.
pub const COMMON_HEADER: &str = include_str!("../../cuda/kiln_cuda.cuh");
/// The GGUF block formats (after the shared header in the sources that use
/// them).
pub const GGUF_BLOCKS_HEADER: &str = include_str!("../../cuda/gguf_blocks.cuh");
/// GGUF's 2- and 3-bit K-quant formats (after the GGUF header).
pub const GGUF_LOW_BITS_HEADER: &str = include_str!("../../cuda/gguf_low_bits.cuh");
/// Rows of dense weights times x, a warp per row (after the GGUF header).
pub const DENSE_ROWS_HEADER: &str = include_str!("../../cuda/dense_rows.cuh");
/// What the decode GEMVs share (after the dense rows' header).
pub const GEMV_HEADER: &str = include_str!("../../cuda/gemv.cuh");
/// What the paged-attention kernels share (after the shared header).
pub const PAGED_ATTENTION_HEADER: &str = include_str!("../../cuda/paged_attention.cuh");
/// The emulator's CUDA-to-C++ header.
pub const EMULATOR_HEADER: &str = include_str!("../../cuda/emulator/kiln_emu.h");

/// A kernel source file.
#[derive(Clone, Copy, Debug)]
pub struct Source {
    /// File name under `kernels/cuda/`.
    pub name: &'static str,
    /// Its text.
    pub text: &'static str,
    /// Every kernel of the file calls `kiln_wait_inputs()` in every thread
    /// before it reads anything but weights or writes anything, so the host
    /// may launch them as programmatic dependents
    /// ([`LaunchConfig::programmatic`](super::LaunchConfig::programmatic)).
    pub waits_for_inputs: bool,
}

/// Normalizations and softmax.
pub const NORM: Source = Source {
    name: "norm.cu",
    text: include_str!("../../cuda/norm.cu"),
    waits_for_inputs: true,
};
/// Rotary embeddings.
pub const ROPE: Source = Source {
    name: "rope.cu",
    text: include_str!("../../cuda/rope.cu"),
    waits_for_inputs: true,
};
/// Paged attention and the KV-cache write.
pub const ATTENTION: Source = Source {
    name: "attention.cu",
    text: include_str!("../../cuda/attention.cu"),
    waits_for_inputs: true,
};
/// Flash attention on tensor cores for prefill over the bf16 cache.
pub const FLASH_ATTENTION: Source = Source {
    name: "flash_attention.cu",
    text: include_str!("../../cuda/flash_attention.cu"),
    waits_for_inputs: false,
};
/// Grouped-query attention of rows one at a time (decode) on tensor cores
/// over the bf16 or fp8 cache.
pub const DECODE_ATTENTION: Source = Source {
    name: "decode_attention.cu",
    text: include_str!("../../cuda/decode_attention.cu"),
    waits_for_inputs: true,
};
/// Embedding, gathers, strided copies and conversions, and the gated
/// activation over a stacked product's rows.
pub const DATA: Source = Source {
    name: "data.cu",
    text: include_str!("../../cuda/data.cu"),
    waits_for_inputs: false,
};

/// The decode GEMVs of dense rows (products of a few rows of x), and the
/// quantization of x to 8 bits for the GGUF GEMVs' `_x8` kernels.
pub const GEMV: Source = gemv("gemv.cu", include_str!("../../cuda/gemv.cu"));

// The GGUF formats' decode GEMVs, the expansion of their blocks to bf16
// and their embedding rows: a module per format, so that they compile side
// by side.
/// Q8_0's GEMVs, expansion and embedding rows.
pub const GEMV_Q8_0: Source = gemv("gemv_q8_0.cu", include_str!("../../cuda/gemv_q8_0.cu"));
/// Q4_0's GEMVs, expansion and embedding rows.
pub const GEMV_Q4_0: Source = gemv("gemv_q4_0.cu", include_str!("../../cuda/gemv_q4_0.cu"));
/// Q5_0's GEMVs, expansion and embedding rows.
pub const GEMV_Q5_0: Source = gemv("gemv_q5_0.cu", include_str!("../../cuda/gemv_q5_0.cu"));
/// Q4_1's GEMVs, expansion and embedding rows.
pub const GEMV_Q4_1: Source = gemv("gemv_q4_1.cu", include_str!("../../cuda/gemv_q4_1.cu"));
/// Q5_1's GEMVs, expansion and embedding rows.
pub const GEMV_Q5_1: Source = gemv("gemv_q5_1.cu", include_str!("../../cuda/gemv_q5_1.cu"));
/// Q4_K's GEMVs, expansion and embedding rows.
pub const GEMV_Q4_K: Source = gemv("gemv_q4_k.cu", include_str!("../../cuda/gemv_q4_k.cu"));
/// The GEMVs of Q4_K groups whose last matrix is Q6_K.
pub const GEMV_Q4_K_Q6_K: Source = gemv(
    "gemv_q4_k_q6_k.cu",
    include_str!("../../cuda/gemv_q4_k_q6_k.cu"),
);
/// Q5_K's GEMVs, expansion and embedding rows.
pub const GEMV_Q5_K: Source = gemv("gemv_q5_k.cu", include_str!("../../cuda/gemv_q5_k.cu"));
/// The GEMVs of Q5_K groups whose last matrix is Q6_K.
pub const GEMV_Q5_K_Q6_K: Source = gemv(
    "gemv_q5_k_q6_k.cu",
    include_str!("../../cuda/gemv_q5_k_q6_k.cu"),
);
/// Q6_K's GEMVs, expansion and embedding rows.
pub const GEMV_Q6_K: Source = gemv("gemv_q6_k.cu", include_str!("../../cuda/gemv_q6_k.cu"));

/// IQ4_NL's GEMVs, expansion and embedding rows.
pub const GEMV_IQ4_NL: Source = gemv("gemv_iq4_nl.cu", include_str!("../../cuda/gemv_iq4_nl.cu"));
/// IQ4_XS's GEMVs, expansion and embedding rows.
pub const GEMV_IQ4_XS: Source = gemv("gemv_iq4_xs.cu", include_str!("../../cuda/gemv_iq4_xs.cu"));
/// Q2_K's GEMVs, expansion and embedding rows.
pub const GEMV_Q2_K: Source = gemv("gemv_q2_k.cu", include_str!("../../cuda/gemv_q2_k.cu"));
/// Q3_K's GEMVs, expansion and embedding rows.
pub const GEMV_Q3_K: Source = gemv("gemv_q3_k.cu", include_str!("../../cuda/gemv_q3_k.cu"));
/// The GEMVs of Q2_K groups whose last matrix is Q3_K or Q4_K.
pub const GEMV_Q2_K_MIXED: Source = gemv(
    "gemv_q2_k_mixed.cu",
    include_str!("../../cuda/gemv_q2_k_mixed.cu"),
);
/// The GEMVs of Q3_K groups whose last matrix is Q4_K or Q5_K.
pub const GEMV_Q3_K_MIXED: Source = gemv(
    "gemv_q3_k_mixed.cu",
    include_str!("../../cuda/gemv_q3_k_mixed.cu"),
);

/// Every decode GEMV source.
pub const GEMVS: [Source; 17] = [
    GEMV,
    GEMV_Q8_0,
    GEMV_Q4_0,
    GEMV_Q5_0,
    GEMV_Q4_1,
    GEMV_Q5_1,
    GEMV_Q4_K,
    GEMV_Q4_K_Q6_K,
    GEMV_Q5_K,
    GEMV_Q5_K_Q6_K,
    GEMV_Q6_K,
    GEMV_IQ4_NL,
    GEMV_IQ4_XS,
    GEMV_Q2_K,
    GEMV_Q2_K_MIXED,
    GEMV_Q3_K,
    GEMV_Q3_K_MIXED,
];

/// A GEMV source: its kernels wait for their inputs.
const fn gemv(name: &'static str, text: &'static str) -> Source {
    Source {
        name,
        text,
        waits_for_inputs: true,
    }
}

/// Products of GGUF-block matrices with batches of up to 64 rows on tensor
/// cores, the blocks decoded into shared memory.
pub const QMATMUL: Source = Source {
    name: "qmatmul.cu",
    text: include_str!("../../cuda/qmatmul.cu"),
    waits_for_inputs: false,
};

/// Sampling of logits rows on the device.
pub const SAMPLING: Source = Source {
    name: "sampling.cu",
    text: include_str!("../../cuda/sampling.cu"),
    waits_for_inputs: false,
};

/// Mixture of experts: routing and the picked experts' products.
pub const MOE: Source = Source {
    name: "moe.cu",
    text: include_str!("../../cuda/moe.cu"),
    waits_for_inputs: false,
};

/// Products of two activations, batched.
pub const MATMUL: Source = Source {
    name: "matmul.cu",
    text: include_str!("../../cuda/matmul.cu"),
    waits_for_inputs: false,
};

/// Every hand-written source.
pub const ALL: [Source; 27] = joined(&[
    &[
        NORM,
        ROPE,
        ATTENTION,
        FLASH_ATTENTION,
        DECODE_ATTENTION,
        DATA,
    ],
    &GEMVS,
    &[QMATMUL, SAMPLING, MOE, MATMUL],
]);

/// The sources of `parts`, one part after another (exactly `N` of them).
const fn joined<const N: usize>(parts: &[&[Source]]) -> [Source; N] {
    let mut all = [NORM; N];
    let (mut at, mut part) = (0, 0);
    while part < parts.len() {
        let mut i = 0;
        while i < parts[part].len() {
            all[at] = parts[part][i];
            at += 1;
            i += 1;
        }
        part += 1;
    }
    assert!(at == N, "ALL's length is the number of sources");
    all
}

/// `text` (the source file `name`) with the `#include`s of the headers
/// above replaced by the headers themselves, between
/// `#line` markers, so a compiler's messages (and the emulator's alignment
/// failures) name the file and line they come from.
pub fn inline_common_header(name: &str, text: &str) -> String {
    let mut out =
        String::with_capacity(text.len() + HEADERS.iter().map(|h| h.1.len()).sum::<usize>());
    out.push_str(&format!("#line 1 \"{name}\"\n"));
    for (index, line) in text.lines().enumerate() {
        let Some(&(header, header_text)) = included(line) else {
            out.push_str(without_pragma_once(line));
            out.push('\n');
            continue;
        };
        out.push_str(&format!("#line 1 \"{header}\"\n"));
        for header_line in header_text.lines() {
            out.push_str(without_pragma_once(header_line));
            out.push('\n');
        }
        out.push_str(&format!("#line {} \"{name}\"\n", index + 2));
    }
    out
}

/// The headers sources include, by file name, the shared one first.
const HEADERS: [(&str, &str); 6] = [
    ("kiln_cuda.cuh", COMMON_HEADER),
    ("gguf_blocks.cuh", GGUF_BLOCKS_HEADER),
    ("gguf_low_bits.cuh", GGUF_LOW_BITS_HEADER),
    ("dense_rows.cuh", DENSE_ROWS_HEADER),
    ("gemv.cuh", GEMV_HEADER),
    ("paged_attention.cuh", PAGED_ATTENTION_HEADER),
];

/// The header `line` includes, if it is an `#include` of one of [`HEADERS`].
fn included(line: &str) -> Option<&'static (&'static str, &'static str)> {
    let file = line.trim().strip_prefix("#include \"")?.strip_suffix('"')?;
    HEADERS.iter().find(|h| h.0 == file)
}

/// The texts of the kernel headers `text` includes, the shared one
/// (`kiln_cuda.cuh`, which defines the primitives) left out: the kernel
/// code a module takes from others besides its own.
pub fn kernel_headers_of(text: &str) -> impl Iterator<Item = &'static str> + '_ {
    text.lines()
        .filter_map(included)
        .filter(|h| h.0 != HEADERS[0].0)
        .map(|h| h.1)
}

/// A line, or an empty one in place of `#pragma once` (the headers are
/// inlined once each; emptied rather than dropped, lines keep their numbers).
fn without_pragma_once(line: &str) -> &str {
    if line.trim() == "#pragma once" {
        ""
    } else {
        line
    }
}

/// The `extern "C" __global__` kernels defined in `text`, in order (a
/// `__launch_bounds__(...)` before the name is skipped).
pub fn kernel_names(text: &str) -> Vec<String> {
    const MARK: &str = "extern \"C\" __global__ void ";
    const BOUNDS: &str = "__launch_bounds__(";
    text.match_indices(MARK)
        .filter_map(|(at, _)| {
            let mut rest = text[at + MARK.len()..].trim_start();
            if let Some(bounds) = rest.strip_prefix(BOUNDS) {
                rest = bounds[bounds.find(')')? + 1..].trim_start();
            }
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
            (end > 0).then(|| rest[..end].to_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_bounds_before_a_name_are_skipped() {
        let text = "extern \"C\" __global__ void __launch_bounds__(128, 4)\n    kiln_a(int x) {}\n\
                    extern \"C\" __global__ void kiln_b() {}";
        assert_eq!(kernel_names(text), ["kiln_a", "kiln_b"]);
        assert!(kernel_names(ATTENTION.text).contains(&"kiln_grouped_attention_g4_bf16".to_owned()));
    }

    #[test]
    fn kernels_are_found_in_every_source() {
        let names: std::collections::HashSet<&str> = ALL.iter().map(|s| s.name).collect();
        assert_eq!(names.len(), ALL.len(), "each source once");
        assert!(GEMVS.iter().all(|g| names.contains(g.name)) && names.contains("matmul.cu"));
        for source in ALL {
            let names = kernel_names(source.text);
            assert!(!names.is_empty(), "{} defines no kernel", source.name);
            assert!(names.iter().all(|n| n.starts_with("kiln_")), "{names:?}");
        }
        assert_eq!(
            kernel_names(NORM.text),
            [
                "kiln_rms_norm",
                "kiln_add_rms_norm",
                "kiln_rms_norm_chunks",
                "kiln_add_rms_norm_chunks",
                "kiln_add_rms_norm_rows",
                "kiln_add_rms_norm_rows_chunks",
                "kiln_norm_add_rms_norm",
                "kiln_norm_add_rms_norm_chunks",
                "kiln_layer_norm",
                "kiln_softmax"
            ]
        );
    }

    #[test]
    fn inlined_headers_keep_every_line_attributed_to_its_file() {
        let text = inline_common_header("gemv_q4_k.cu", GEMV_Q4_K.text);
        assert!(!text.contains("#include") && !text.contains("#pragma once"));
        // Follow the #line markers: each line's (file, number) after the
        // inlining must be the one it has in its own file.
        let files = [
            ("gemv_q4_k.cu", GEMV_Q4_K.text),
            ("kiln_cuda.cuh", COMMON_HEADER),
            ("gguf_blocks.cuh", GGUF_BLOCKS_HEADER),
            ("dense_rows.cuh", DENSE_ROWS_HEADER),
            ("gemv.cuh", GEMV_HEADER),
        ];
        let (mut file, mut number) = ("", 0usize);
        let mut checked = 0;
        for line in text.lines() {
            if let Some(marker) = line.strip_prefix("#line ") {
                let (n, name) = marker.split_once(' ').expect("#line N \"file\"");
                number = n.parse().expect("a line number");
                file = files
                    .iter()
                    .find(|f| format!("\"{}\"", f.0) == name)
                    .expect("a known file")
                    .1;
                continue;
            }
            let original = file.lines().nth(number - 1).expect("a line of the file");
            if original.trim() != "#pragma once" {
                assert_eq!(line, original);
                checked += 1;
            }
            number += 1;
        }
        let total: usize = files.iter().map(|f| f.1.lines().count()).sum();
        assert_eq!(
            checked,
            total - 4 - 4,
            "every line but the includes and pragmas"
        );
    }
}
