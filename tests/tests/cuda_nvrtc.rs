//! Every CUDA kernel compiles for the GPUs Kiln targets (sm_80 and sm_90)
//! with NVRTC, on a machine without a GPU: the hand-written sources under
//! `kernels/cuda/` and the kernels the compiler generates for every tiny
//! family. ptxas's statistics (through NVRTC's `--ptxas-options=-v`) show
//! that no hand-written kernel spills to local memory, nor keeps more than
//! a call's saved registers on its stack (`MAX_STACK_FRAME`). With
//! `KILN_CUBIN_DIR` set, the hand-written modules' cubins are written there
//! (`<source>.<arch>.cubin`) for `cuobjdump -sass`: instruction counts of a
//! kernel's loop without a GPU. `KILN_NVRTC_SOURCES=qmatmul.cu,moe.cu`
//! compiles only the hand-written sources named (while working on them).
//!
//! NVRTC comes from the `nvidia-cuda-nvrtc` wheel that `.ci/setup` unpacks
//! into `target/cuda` (or from `KILN_NVRTC_DIR`).

use std::path::PathBuf;
use std::sync::Once;

use kiln_host::runtime::cuda::CudaExecutor;
use kiln_kernels::cuda::cubin_cache::{self, CubinCache};
use kiln_kernels::cuda::{nvrtc, sources};
use kiln_tests::models::{write_model_dir, DeviceChoice, WeightDtype};
use rayon::prelude::*;

const ARCHES: [&str; 2] = ["sm_80", "sm_90"];

/// The largest stack frame a hand-written kernel may have, in bytes a
/// thread: room for a non-inlined call's saved registers. A kernel whose
/// parameter's address reaches a call copies the whole parameter to its
/// stack, every thread, at its start: the GEMVs' 336-byte frames of
/// 2026-12-01 wrote more bytes than their weights and halved batch-1
/// decode on the H200 (bench/results/gpu-2026-12-04).
const MAX_STACK_FRAME: u32 = 64;

/// Kernels whose frame holds a local array by design, and why.
const LOCAL_ARRAYS: [(&str, &str); 1] = [(
    "kiln_moe_route",
    "a thread routes one token: its expert groups' scores and picks",
)];

/// Loads NVRTC from the unpacked wheel; fails with what to run when absent.
fn load_nvrtc() {
    static LOAD: Once = Once::new();
    LOAD.call_once(|| {
        let dir = std::env::var_os("KILN_NVRTC_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                kiln_tests::workspace_root().join("target/cuda/nvidia/cu13/lib")
            });
        assert!(
            dir.join("libnvrtc.so.13").is_file(),
            "NVRTC is not installed at {}: run .ci/setup (it unpacks nvidia-cuda-nvrtc there) or set KILN_NVRTC_DIR",
            dir.display()
        );
        nvrtc::preload(&dir).unwrap();
        assert!(nvrtc::available());
        let (major, minor) = nvrtc::version().unwrap();
        println!("NVRTC {major}.{minor} from {}", dir.display());
    });
}

#[test]
fn hand_written_kernels_compile_for_sm80_and_sm90_without_spills() {
    load_nvrtc();
    // Every (module, architecture) on its own NVRTC program, spread over the
    // machine's threads (minutes one after another on two cores).
    let only = std::env::var("KILN_NVRTC_SOURCES").ok();
    let chosen = |s: &&sources::Source| {
        only.as_ref()
            .is_none_or(|o| o.split(',').any(|n| n == s.name))
    };
    let jobs: Vec<(&sources::Source, &str)> = sources::ALL
        .iter()
        .filter(chosen)
        .flat_map(|source| ARCHES.map(|arch| (source, arch)))
        .collect();
    assert!(!jobs.is_empty(), "KILN_NVRTC_SOURCES names no source");
    let compiled: Vec<nvrtc::Compiled> = jobs
        .par_iter()
        .map(|&(source, arch)| {
            nvrtc::compile(source.name, source.text, arch, true).unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    let mut report = String::new();
    let mut spills = Vec::new();
    let mut stacks = Vec::new();
    for (&(source, arch), compiled) in jobs.iter().zip(compiled) {
        assert!(!compiled.image.is_empty());
        if let Some(dir) = std::env::var_os("KILN_CUBIN_DIR") {
            let stem = source.name.trim_end_matches(".cu");
            let path = PathBuf::from(dir).join(format!("{stem}.{arch}.cubin"));
            std::fs::write(&path, &compiled.image)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
        let stats = nvrtc::parse_ptxas_log(&compiled.log);
        for name in sources::kernel_names(source.text) {
            let s = stats.iter().find(|s| s.name == name).unwrap_or_else(|| {
                panic!("no ptxas statistics for {name} ({arch}):\n{}", compiled.log)
            });
            report.push_str(&format!(
                "{arch} {:<28} {:>3} registers, spills {} B stored / {} B loaded, stack frame {} B\n",
                s.name, s.registers, s.spill_stores, s.spill_loads, s.stack_frame
            ));
            if s.spill_stores + s.spill_loads > 0 {
                spills.push(format!("{} on {arch}", s.name));
            }
            let local_array = LOCAL_ARRAYS.iter().any(|(kernel, _)| *kernel == s.name);
            if s.stack_frame > MAX_STACK_FRAME && !local_array {
                stacks.push(format!("{} on {arch}: {} B", s.name, s.stack_frame));
            }
        }
    }
    println!("{report}");
    assert!(
        spills.is_empty(),
        "kernels spill to local memory: {spills:?}"
    );
    assert!(
        stacks.is_empty(),
        "stack frames over {MAX_STACK_FRAME} B (a parameter's address taken by a call?): {stacks:?}"
    );
}

#[test]
fn a_kernel_with_an_error_is_reported_with_nvrtc_log() {
    load_nvrtc();
    let source = "#include \"kiln_cuda.cuh\"\nextern \"C\" __global__ void broken(float* x) { x[0] = undefined_name; }\n";
    let err = nvrtc::compile("broken.cu", source, "sm_90", false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("broken.cu for sm_90"), "{err}");
    assert!(err.contains("undefined_name"), "{err}");
}

#[test]
fn generated_kernels_of_every_tiny_family_compile_for_sm80_and_sm90() {
    load_nvrtc();
    let families = kiln_tests::models::TINY_FAMILIES;
    let mut compiled = 0;
    for family in families {
        let (config, weights) = kiln_tests::models::tiny_model(family);
        let dir = tempfile::tempdir().unwrap();
        write_model_dir(&config, &weights, dir.path(), false);
        let model = kiln_tests::models::load_model_on(
            dir.path(),
            DeviceChoice::CudaEmulated,
            WeightDtype::Auto,
        );
        let backend = model.backend.as_ref();
        let cuda = backend
            .as_any()
            .downcast_ref::<CudaExecutor>()
            .expect("a CUDA backend");
        let generated = cuda.generated_kernels();
        assert!(!generated.is_empty(), "{family}: no generated kernel");
        for (name, text) in generated {
            for arch in ARCHES {
                nvrtc::compile(name, text, arch, false)
                    .unwrap_or_else(|e| panic!("{family}: {e}\n{text}"));
                compiled += 1;
            }
        }
    }
    println!("{compiled} generated kernel compilations");
}

/// `host precompile`'s cache: a module's cubin lands at the path the real
/// device looks up (the hash of its inlined text, options, architecture and
/// NVRTC's version), is an ELF image, and is taken from there the second
/// time; another text or architecture is another path.
#[test]
fn precompiled_cubins_sit_where_the_device_reads_them() {
    load_nvrtc();
    let dir = tempfile::tempdir().unwrap();
    let cache = CubinCache::new(dir.path().to_owned(), "sm_90");
    let norm = sources::NORM;
    for cached in [false, true] {
        let outcomes = cubin_cache::precompile(&cache, &[norm]);
        let [outcome] = outcomes.as_slice() else {
            panic!("one outcome a module: {outcomes:?}")
        };
        assert_eq!((outcome.name, outcome.cached), (norm.name, cached));
        let path = outcome.result.as_ref().unwrap();
        assert_eq!(path, &cache.path(norm.name, norm.text).unwrap());
        let image = std::fs::read(path).unwrap();
        assert!(image.starts_with(b"\x7fELF"), "not a cubin");
    }
    let other = cache.path(norm.name, &format!("{}\n", norm.text)).unwrap();
    assert_ne!(other, cache.path(norm.name, norm.text).unwrap());
    let sm80 = CubinCache::new(dir.path().to_owned(), "sm_80");
    let sm90_path = cache.path(norm.name, norm.text).unwrap();
    assert_ne!(sm80.path(norm.name, norm.text).unwrap(), sm90_path);
}
