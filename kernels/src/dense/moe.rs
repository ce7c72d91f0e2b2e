//! Mixture-of-experts routing: a token's router logits to the experts it
//! runs through and their weights, as Hugging Face's Mixtral, Qwen-MoE and
//! DeepSeek-V3 routers compute them (the CUDA `kiln_moe_route` kernel
//! mirrors this).

/// How scores are made and experts picked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scoring<'a> {
    /// Softmax over the experts; the `top_k` best scores are picked.
    Softmax,
    /// Sigmoid scores. Picks use the score plus `bias` (if any), within the
    /// `top_groups` best of `groups` equal groups, each ranked by the sum of
    /// its two best biased scores (other groups' experts count as 0); the
    /// weights are the unbiased scores.
    Sigmoid {
        /// Correction bias, one per expert.
        bias: Option<&'a [f32]>,
        /// Equal groups of experts.
        groups: usize,
        /// Groups a token picks from.
        top_groups: usize,
    },
}

/// A router's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Router<'a> {
    /// Experts per token.
    pub top_k: usize,
    /// Scoring and picking.
    pub scoring: Scoring<'a>,
    /// Divide the picked weights by their sum.
    pub renormalize: bool,
    /// Multiplies the weights.
    pub scale: f32,
}

/// Index of the largest `values[i]` not yet `taken`
/// (the first on ties, as `torch.topk` on CPU picks).
fn best(values: &[f32], taken: &[bool]) -> usize {
    let mut pick = usize::MAX;
    for (i, &v) in values.iter().enumerate() {
        if !taken[i] && (pick == usize::MAX || v > values[pick]) {
            pick = i;
        }
    }
    pick
}

/// Routes one token: `logits [E]` to `experts [top_k]` (best first) and
/// their `weights [top_k]`.
pub fn route(router: &Router<'_>, logits: &[f32], experts: &mut [u32], weights: &mut [f32]) {
    let n = logits.len();
    let k = router.top_k;
    assert!(k <= n && experts.len() == k && weights.len() == k);
    let (scores, choice) = match router.scoring {
        Scoring::Softmax => {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let exp: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
            let sum: f32 = exp.iter().sum();
            let scores: Vec<f32> = exp.iter().map(|&e| e / sum).collect();
            (scores.clone(), scores)
        }
        Scoring::Sigmoid {
            bias,
            groups,
            top_groups,
        } => {
            let scores: Vec<f32> = logits.iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect();
            let mut choice: Vec<f32> = match bias {
                Some(bias) => scores.iter().zip(bias).map(|(s, b)| s + b).collect(),
                None => scores.clone(),
            };
            if groups > 1 && top_groups < groups {
                let size = n / groups;
                let group_scores: Vec<f32> = choice
                    .chunks(size)
                    .map(|g| {
                        let mut taken = vec![false; g.len()];
                        let first = best(g, &taken);
                        taken[first] = true;
                        let second = best(g, &taken);
                        g[first] + if second == usize::MAX { 0.0 } else { g[second] }
                    })
                    .collect();
                let mut kept = vec![false; groups];
                for _ in 0..top_groups {
                    let g = best(&group_scores, &kept);
                    kept[g] = true;
                }
                for (g, group) in choice.chunks_mut(size).enumerate() {
                    if !kept[g] {
                        group.fill(0.0);
                    }
                }
            }
            (scores, choice)
        }
    };
    let mut taken = vec![false; n];
    for slot in 0..k {
        let e = best(&choice, &taken);
        taken[e] = true;
        experts[slot] = e as u32;
        weights[slot] = scores[e];
    }
    if router.renormalize {
        let sum: f32 = weights.iter().sum();
        weights.iter_mut().for_each(|w| *w /= sum);
    }
    if router.scale != 1.0 {
        weights.iter_mut().for_each(|w| *w *= router.scale);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routed(router: &Router<'_>, logits: &[f32]) -> (Vec<u32>, Vec<f32>) {
        let mut experts = vec![0; router.top_k];
        let mut weights = vec![0.0; router.top_k];
        route(router, logits, &mut experts, &mut weights);
        (experts, weights)
    }

    #[test]
    fn softmax_picks_the_best_and_renormalizes() {
        let logits = [0.0, 2.0, 1.0, -1.0];
        let router = Router {
            top_k: 2,
            scoring: Scoring::Softmax,
            renormalize: false,
            scale: 1.0,
        };
        let (experts, weights) = routed(&router, &logits);
        assert_eq!(experts, [1, 2]);
        let sum: f32 = logits.iter().map(|l| l.exp()).sum();
        assert!((weights[0] - 2f32.exp() / sum).abs() < 1e-6);
        let (_, weights) = routed(
            &Router {
                renormalize: true,
                ..router
            },
            &logits,
        );
        let e = 1f32.exp();
        assert!((weights[0] - e / (e + 1.0)).abs() < 1e-6, "{weights:?}");
    }

    #[test]
    fn grouped_sigmoid_picks_within_the_best_groups() {
        // Groups {0,1}, {2,3}, {4,5}: with the bias, group 2 ranks first;
        // expert 3, the best unbiased score, is outside it.
        let logits = [1.0, 0.5, -1.0, 3.0, 0.0, 0.2];
        let bias = [0.0, 0.0, 0.0, 0.0, 2.0, 2.0];
        let router = Router {
            top_k: 2,
            scoring: Scoring::Sigmoid {
                bias: Some(&bias),
                groups: 3,
                top_groups: 1,
            },
            renormalize: false,
            scale: 2.5,
        };
        let (experts, weights) = routed(&router, &logits);
        assert_eq!(experts, [5, 4]);
        let sigmoid = |x: f32| 1.0 / (1.0 + (-x).exp());
        assert!((weights[0] - 2.5 * sigmoid(0.2)).abs() < 1e-6);
        assert!((weights[1] - 2.5 * sigmoid(0.0)).abs() < 1e-6);
    }
}
