//! The mixture-of-experts router (`kiln_moe_route` in `kernels/cuda/moe.cu`)
//! on the kernel emulator against the CPU router of `dense::moe`: softmax
//! routing with and without renormalization, and DeepSeek-V3's sigmoid
//! routing with a correction bias, group-limited picks and a scale (which
//! `tiny_deepseek_v3` also runs end to end).

use kiln_kernels::cuda::sources;
use kiln_kernels::cuda::KernelArg::{Ptr, F32};
use kiln_kernels::dense::moe::{route, Router, Scoring};

mod common;
use common::*;

#[test]
fn routing_matches_the_cpu() {
    let gpu = Gpu::new(&[sources::MOE]);
    let (tokens, experts, top_k) = (7, 16, 4);
    let mut rng = Rng::new(11);
    let logits = rng.data(tokens * experts, 3.0);
    let bias = rng.data(experts, 0.5);
    let (logits_p, bias_p) = (gpu.up(&logits), gpu.up(&bias));
    // (what, scoring code, groups, top groups, renormalize, scale, bias)
    let cases = [
        ("softmax", 0, 1, 1, false, 1.0, false),
        ("softmax renormalized", 0, 1, 1, true, 1.0, false),
        ("sigmoid", 1, 1, 1, false, 1.0, false),
        (
            "sigmoid, bias, 2 of 4 groups, scaled",
            1,
            4,
            2,
            true,
            2.5,
            true,
        ),
    ];
    for (what, scoring, groups, top_groups, renormalize, scale, with_bias) in cases {
        let picks = gpu.zeros(tokens * top_k * 4);
        let weights = gpu.zeros(tokens * top_k * 4);
        let args = [
            Ptr(logits_p),
            Ptr(if with_bias { bias_p } else { 0 }),
            Ptr(picks),
            Ptr(weights),
            int(experts),
            int(top_k),
            int(scoring),
            int(groups),
            int(top_groups),
            int(usize::from(renormalize)),
            F32(scale),
        ];
        gpu.run("kiln_moe_route", (tokens as u32, 1), 1, &args);
        let router = Router {
            top_k,
            scoring: match scoring {
                0 => Scoring::Softmax,
                _ => Scoring::Sigmoid {
                    bias: with_bias.then_some(&bias[..]),
                    groups,
                    top_groups,
                },
            },
            renormalize,
            scale,
        };
        let got_picks: Vec<i32> = gpu.down(picks, tokens * top_k);
        let got_weights: Vec<f32> = gpu.down(weights, tokens * top_k);
        for t in 0..tokens {
            let (mut want_picks, mut want_weights) = (vec![0u32; top_k], vec![0f32; top_k]);
            let row = &logits[t * experts..(t + 1) * experts];
            route(&router, row, &mut want_picks, &mut want_weights);
            let slots = t * top_k..(t + 1) * top_k;
            let picked: Vec<u32> = got_picks[slots.clone()].iter().map(|&e| e as u32).collect();
            assert_eq!(picked, want_picks, "{what}, token {t}");
            close(
                &got_weights[slots],
                &want_weights,
                1e-6,
                &format!("{what}, token {t}"),
            );
        }
    }
}
