//! The decode GEMV's split of rows among warps (`kernels/cuda/gemv.cuh`'s
//! `_s2`/`_s4` kernels, chosen per launch shape by `runtime/cuda/tune.rs`)
//! on the CUDA backend under test (the kernel emulator, or a GPU with
//! KILN_TEST_CUDA_DEVICE): each fixed split, and the splits chosen by
//! timing, give the CPU backend's decode logits on dense and packed GGUF
//! weights.

use kiln_host::device::DeviceChoice;
use kiln_host::model::synthetic::ShapeDtype;
use kiln_host::model::{LoadOptions, Model};
use kiln_host::runtime::cuda::{CudaExecutor, GemvSplits, WeightDtype};
use kiln_host::runtime::KvCacheDtype;
use kiln_tests::models::decode_agrees;

fn load(dtype: ShapeDtype, device: DeviceChoice, gemv_splits: GemvSplits) -> Model {
    // f32 weights and cache where the shape is dense: only the order of the
    // products' sums differs from the CPU.
    let options = LoadOptions {
        kv_cache_dtype: KvCacheDtype::Float32,
        dtype: WeightDtype::Float32,
        gemv_splits,
        ..kiln_tests::models::shape_options(device)
    };
    kiln_tests::models::shape_model("tiny-llama.json", dtype, &options)
}

#[test]
fn every_split_and_the_timed_choice_match_the_cpu() {
    let prompt: Vec<u32> = (0..6).map(|i| (i * 37 + 5) % 512).collect();
    // Every format's kernels in every split are checked against the CPU's
    // decoding in kernels/tests/cuda_gemv.rs; here whole models: dense in
    // each split and timed, Q4_K_M (Q4_K and Q6_K) in the widest split.
    let cases: [(ShapeDtype, &[GemvSplits]); 2] = [
        (
            ShapeDtype::F32,
            &[
                GemvSplits::Fixed(2),
                GemvSplits::Fixed(4),
                GemvSplits::Timed,
            ],
        ),
        (ShapeDtype::Q4KM, &[GemvSplits::Fixed(4)]),
    ];
    for (dtype, splits) in cases {
        let cpu = load(dtype, DeviceChoice::Cpu, GemvSplits::Auto);
        for &splits in splits {
            let cuda = load(dtype, kiln_tests::models::cuda_test_device(), splits);
            let executor: &CudaExecutor = cuda.backend.as_any().downcast_ref().unwrap();
            let counts = executor.gemv_split_counts();
            // q/k/v, o, gate/up, down and the logits, for one row and several.
            assert!(
                counts.iter().sum::<usize>() >= 5,
                "{dtype:?} {splits:?}: {counts:?}"
            );
            match splits {
                GemvSplits::Fixed(2) => assert_eq!(counts[0] + counts[2], 0, "{counts:?}"),
                GemvSplits::Fixed(4) => assert_eq!(counts[0] + counts[1], 0, "{counts:?}"),
                _ => {}
            }
            decode_agrees(&cpu, &cuda, &prompt, &format!("{dtype:?} {splits:?}"));
        }
    }
}
