//! The sampling contract between the engine and the backends: for each
//! logits row, the engine says how to pick a token ([`RowSampling`]: the
//! filters, the uniform draw from the request's seeded generator, the token
//! adjustments of penalties and bans, a structured-output mask, the
//! log-probabilities wanted) and the backend answers with the token
//! ([`Sampled`]). The CPU backend runs [`sample_row`] here; the CUDA backend
//! runs `kernels/cuda/sampling.cu`, which follows the same steps, so one
//! draw picks one token on either.

/// A token whose logit the penalties, the request's logit bias or bans
/// change.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenAdjustment {
    /// The token.
    pub token: u32,
    /// Times it was generated so far (frequency and presence penalties).
    pub generated: u32,
    /// Seen in the prompt or the output (repetition penalty).
    pub seen: bool,
    /// Suppressed (e.g. end-of-sequence before `min_tokens`).
    pub banned: bool,
    /// Added to the logit after the penalties (`logit_bias`).
    pub bias: f32,
}

/// Temperatures below this are greedy (as in vLLM): dividing by less
/// overflows the logits.
pub const MIN_TEMPERATURE: f32 = 1e-5;

/// How to pick the token of one logits row.
#[derive(Clone, Debug, PartialEq)]
pub struct RowSampling {
    /// 0 (or below [`MIN_TEMPERATURE`]): greedy, the first largest logit.
    pub temperature: f32,
    /// Keep the `top_k` most likely (0: all).
    pub top_k: usize,
    /// Keep the shortest prefix reaching `top_p` (1: all).
    pub top_p: f32,
    /// Drop what is less likely than `min_p` × the most likely (0: none).
    pub min_p: f32,
    /// The draw in [0, 1) (unused when greedy).
    pub uniform: f32,
    /// Hugging Face repetition penalty (1: none).
    pub repetition: f32,
    /// OpenAI frequency penalty.
    pub frequency: f32,
    /// OpenAI presence penalty.
    pub presence: f32,
    /// Tokens the penalties, the logit bias and bans touch.
    pub adjustments: Vec<TokenAdjustment>,
    /// `Some(n)`: the chosen token's log-probability and the `n` most likely
    /// tokens', from the row before penalties and temperature.
    pub logprobs: Option<usize>,
    /// Structured output: only these tokens may be picked (bit `t % 32` of
    /// word `t / 32`; tokens beyond the mask are not allowed).
    pub allowed: Option<Vec<u32>>,
    /// Speculative decoding: a token proposed for this row, which a
    /// sampled row keeps or replaces as [`Draft`] says (a greedy row picks
    /// as ever: the draft is kept when it is the pick).
    pub draft: Option<Draft>,
}

/// A token proposed for a sampled row (a proposal of one token, as n-gram
/// lookup makes): kept when the row's draw falls below the probability
/// the row's filters give it, else the row's token is drawn with `again`
/// from the other kept tokens, so the token comes out as it would without
/// the draft (vLLM's rejection sampler for such proposals).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Draft {
    /// The proposed token.
    pub token: u32,
    /// The second draw in [0, 1), for a draft not kept.
    pub again: f32,
}

impl RowSampling {
    /// Greedy, nothing else.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            uniform: 0.0,
            repetition: 1.0,
            frequency: 0.0,
            presence: 0.0,
            adjustments: Vec::new(),
            logprobs: None,
            allowed: None,
            draft: None,
        }
    }
}

/// The token picked for a row.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    /// The token.
    pub token: u32,
    /// Its log-probability, when asked for.
    pub logprob: Option<f32>,
    /// The most likely tokens and their log-probabilities, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// Picks the token of `logits` as `row` says (the host implementation).
pub fn sample_row(logits: &[f32], row: &RowSampling) -> Sampled {
    let raw = row.logprobs.map(|_| log_softmax(logits));
    let token = pick(&adjusted(logits, row), row);
    let (logprob, top) = match (raw, row.logprobs) {
        (Some(lp), Some(n)) => (Some(lp[token as usize]), top_logprobs(&lp, n)),
        _ => (None, Vec::new()),
    };
    Sampled {
        token,
        logprob,
        top,
    }
}

/// `logits` with `row`'s mask, penalties, bias and bans applied.
fn adjusted(logits: &[f32], row: &RowSampling) -> Vec<f32> {
    let mut adjusted = logits.to_vec();
    if let Some(mask) = &row.allowed {
        for (w, chunk) in adjusted.chunks_mut(32).enumerate() {
            let bits = mask.get(w).copied().unwrap_or(0);
            if bits != u32::MAX {
                for (b, l) in chunk.iter_mut().enumerate() {
                    if bits >> b & 1 == 0 {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }
    apply_adjustments(&mut adjusted, row);
    adjusted
}

/// Penalties (repetition, then frequency and presence), the logit bias and
/// bans.
fn apply_adjustments(logits: &mut [f32], row: &RowSampling) {
    for a in &row.adjustments {
        let Some(l) = logits.get_mut(a.token as usize) else {
            continue;
        };
        if a.seen && row.repetition != 1.0 {
            *l = if *l > 0.0 {
                *l / row.repetition
            } else {
                *l * row.repetition
            };
        }
        if a.generated > 0 {
            *l -= row.frequency * a.generated as f32 + row.presence;
        }
        *l += a.bias;
        if a.banned {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// The tokens a sampled row may pick: temperature, top-k, softmax, min-p
/// and top-p applied; `probs` sum to `total` (below 1 when filtered).
struct Kept {
    /// Token and scaled logit, most likely first.
    candidates: Vec<(u32, f32)>,
    probs: Vec<f32>,
    total: f32,
}

impl Kept {
    /// `None` where the row is greedy (or nothing is finite after the
    /// temperature): the pick is the argmax.
    fn of(logits: &[f32], row: &RowSampling) -> Option<Self> {
        if row.temperature < MIN_TEMPERATURE {
            return None;
        }
        // Finite after the division (a huge logit over a small temperature is not).
        let mut candidates: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l / row.temperature))
            .filter(|(_, l)| l.is_finite())
            .collect();
        if candidates.is_empty() {
            return None;
        }
        candidates.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if row.top_k > 0 {
            candidates.truncate(row.top_k);
        }
        // Softmax over the survivors.
        let max = candidates[0].1;
        let mut probs: Vec<f32> = candidates.iter().map(|(_, l)| (l - max).exp()).collect();
        let total: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
        let mut keep = probs.len();
        if row.min_p > 0.0 {
            let floor = row.min_p * probs[0];
            keep = keep.min(
                probs
                    .iter()
                    .position(|&p| p < floor)
                    .unwrap_or(probs.len())
                    .max(1),
            );
        }
        if row.top_p < 1.0 {
            let mut cumulative = 0.0;
            for (i, p) in probs.iter().enumerate().take(keep) {
                cumulative += p;
                if cumulative >= row.top_p {
                    keep = i + 1;
                    break;
                }
            }
        }
        candidates.truncate(keep);
        probs.truncate(keep);
        let total = probs.iter().sum();
        Some(Self {
            candidates,
            probs,
            total,
        })
    }
}

/// Greedy, or the draw among the kept tokens; for a row with a [`Draft`],
/// the draft when the draw falls below its probability, else the second
/// draw among the other kept tokens.
fn pick(logits: &[f32], row: &RowSampling) -> u32 {
    let Some(kept) = Kept::of(logits, row) else {
        return argmax(logits);
    };
    let (skip, mut draw) = match row.draft {
        None => (None, row.uniform * kept.total),
        Some(draft) => {
            let at = kept.candidates.iter().position(|&(t, _)| t == draft.token);
            let p_draft = at.map_or(0.0, |i| kept.probs[i]);
            if row.uniform * kept.total < p_draft {
                return draft.token;
            }
            (at, draft.again * (kept.total - p_draft))
        }
    };
    let mut last = None;
    for (i, p) in kept.probs.iter().enumerate() {
        if Some(i) == skip {
            continue;
        }
        last = Some(i);
        draw -= p;
        if draw <= 0.0 {
            return kept.candidates[i].0;
        }
    }
    // Rounding left a little of the draw: the last kept token. Nothing but
    // a draft was kept only if it had all the mass, and then it was kept.
    match (last, row.draft) {
        (Some(i), _) => kept.candidates[i].0,
        (None, draft) => draft.map_or(kept.candidates[0].0, |d| d.token),
    }
}

/// The index of the largest logit (the first on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Log-softmax of a row.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|l| (l - max).exp()).sum();
    let log_sum = sum.ln();
    logits.iter().map(|l| (l - max) - log_sum).collect()
}

/// The `n` largest log-probabilities, largest first (ties by index).
pub fn top_logprobs(lp: &[f32], n: usize) -> Vec<(u32, f32)> {
    let mut order: Vec<u32> = (0..lp.len() as u32).collect();
    let k = n.min(order.len());
    if k == 0 {
        return Vec::new();
    }
    let by_value = |a: &u32, b: &u32| lp[*b as usize].total_cmp(&lp[*a as usize]).then(a.cmp(b));
    order.select_nth_unstable_by(k - 1, by_value);
    order.truncate(k);
    order.sort_by(by_value);
    order.into_iter().map(|t| (t, lp[t as usize])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(temperature: f32, top_k: usize, top_p: f32, min_p: f32, uniform: f32) -> RowSampling {
        RowSampling {
            temperature,
            top_k,
            top_p,
            min_p,
            uniform,
            ..RowSampling::greedy()
        }
    }

    #[test]
    fn greedy_takes_the_first_argmax() {
        assert_eq!(
            sample_row(&[0.1, 3.0, 3.0], &RowSampling::greedy()).token,
            1
        );
    }

    #[test]
    fn filters_restrict_the_choice() {
        let logits = [2.0, 1.9, 1.8, -5.0];
        for u in 0..100 {
            let u = u as f32 / 100.0;
            assert_eq!(
                sample_row(&logits, &row(1.0, 1, 1.0, 0.0, u)).token,
                0,
                "top_k = 1"
            );
            assert!(
                sample_row(&logits, &row(1.0, 0, 0.5, 0.0, u)).token <= 1,
                "top_p = 0.5 keeps two"
            );
            assert!(
                sample_row(&logits, &row(1.0, 0, 1.0, 0.5, u)).token <= 2,
                "min_p drops the unlikely one"
            );
        }
        // The draw walks the sorted probabilities: p = 0.25, 0.75.
        let logits = [0.0, (3.0f32).ln()];
        assert_eq!(sample_row(&logits, &row(1.0, 0, 1.0, 0.0, 0.7)).token, 1);
        assert_eq!(sample_row(&logits, &row(1.0, 0, 1.0, 0.0, 0.8)).token, 0);
    }

    #[test]
    fn adjustments_follow_their_definitions() {
        let adjust = |token, generated, seen, banned| TokenAdjustment {
            token,
            generated,
            seen,
            banned,
            bias: 0.0,
        };
        let mut r = RowSampling::greedy();
        r.repetition = 2.0;
        r.frequency = 0.5;
        r.presence = 0.25;
        r.adjustments = vec![
            adjust(0, 0, true, false),
            adjust(1, 2, true, false),
            adjust(3, 0, false, true),
        ];
        // The bias comes after the penalties; a ban wins over it.
        r.adjustments.push(TokenAdjustment {
            bias: 1.5,
            ..adjust(2, 1, false, false)
        });
        r.adjustments[2].bias = 100.0;
        let mut logits = vec![2.0, -2.0, 1.0, 5.0];
        apply_adjustments(&mut logits, &r);
        assert_eq!(logits, [1.0, -5.25, 1.75, f32::NEG_INFINITY]);
    }

    #[test]
    fn log_probabilities_come_from_the_raw_row() {
        let mut r = RowSampling::greedy();
        r.logprobs = Some(2);
        r.adjustments = vec![TokenAdjustment {
            token: 2,
            generated: 0,
            seen: false,
            banned: true,
            bias: 0.0,
        }];
        let out = sample_row(&[1.0, 2.0, 3.0], &r);
        assert_eq!(out.token, 1);
        let lp = log_softmax(&[1.0, 2.0, 3.0]);
        assert_eq!(out.logprob, Some(lp[1]));
        assert_eq!(out.top, vec![(2, lp[2]), (1, lp[1])]);
    }

    /// The distribution of a row's token over `n` evenly spaced draws.
    fn token_frequencies(n: usize, mut token: impl FnMut(f32, f32) -> u32) -> Vec<f64> {
        let mut counts = vec![0f64; 8];
        for i in 0..n {
            for j in 0..n {
                let (u, v) = ((i as f32 + 0.5) / n as f32, (j as f32 + 0.5) / n as f32);
                counts[token(u, v) as usize] += 1.0 / (n * n) as f64;
            }
        }
        counts
    }

    #[test]
    fn a_drafted_row_keeps_its_distribution() {
        let logits = [1.0, 2.5, 0.3, 2.2, -1.0, 0.9, 1.7, f32::NEG_INFINITY];
        for (temperature, top_k, top_p, min_p) in
            [(1.0, 0, 1.0, 0.0), (0.7, 5, 0.9, 0.0), (1.3, 0, 0.95, 0.1)]
        {
            let sampled =
                |u: f32| sample_row(&logits, &row(temperature, top_k, top_p, min_p, u)).token;
            let want = token_frequencies(400, |u, _| sampled(u));
            for draft in 0..8 {
                // Kept with the draft's probability, else drawn from the rest.
                let drafted = |u, again| {
                    let row = RowSampling {
                        draft: Some(Draft {
                            token: draft,
                            again,
                        }),
                        ..row(temperature, top_k, top_p, min_p, u)
                    };
                    sample_row(&logits, &row).token
                };
                let got = token_frequencies(400, drafted);
                for (t, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!((g - w).abs() < 0.01, "draft {draft}, token {t}: {g} vs {w} ({temperature}, {top_k}, {top_p}, {min_p})");
                }
                // Kept by the first draw alone: whatever the second.
                let kept = token_frequencies(400, |u, _| {
                    u32::from(drafted(u, 0.0) == draft && drafted(u, 0.999) == draft)
                })[1];
                assert!(
                    (kept - want[draft as usize]).abs() < 0.01,
                    "draft {draft} kept {kept}"
                );
            }
        }
        // Greedy: the pick, whatever the draft.
        for token in [1, 3] {
            let greedy = RowSampling {
                draft: Some(Draft { token, again: 0.5 }),
                ..RowSampling::greedy()
            };
            assert_eq!(sample_row(&logits, &greedy).token, 1);
        }
    }
}
