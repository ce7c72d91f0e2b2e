//! Speculative decoding by n-gram lookup (vLLM's `ngram` method, prompt
//! lookup decoding): a sequence whose last tokens occurred earlier in its
//! prompt or output proposes the tokens that followed them there as drafts;
//! one step feeds its last token and the drafts, each as a decode row whose
//! token the backend picks where the logits are, and each draft in turn is
//! kept as the row before it would pick it (greedy: when it is that row's
//! pick; sampled: with the probability the row gives it, else the row's
//! token is drawn from the rest: `runtime::sampling::Draft`), up to the
//! first not kept, whose row's own token follows. Greedy output is the one plain decoding gives, and
//! sampled output has the same distribution, in fewer steps where text
//! repeats (quoting, editing code, extraction): a step of a few rows reads
//! the weights once, as a step of one does.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use serde::Deserialize;

/// `--speculative-config`, vLLM's JSON: `{"method": "ngram",
/// "num_speculative_tokens": K, "prompt_lookup_max": N, "prompt_lookup_min":
/// M}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramConfig {
    /// Drafts proposed at most per step.
    pub num_speculative_tokens: usize,
    /// Shortest suffix of the sequence looked up.
    pub prompt_lookup_min: usize,
    /// Longest suffix of the sequence looked up (the longest that matches
    /// is taken).
    pub prompt_lookup_max: usize,
}

/// The JSON as given; fields Kiln does not implement are refused by name.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SpeculativeJson {
    method: Option<String>,
    model: Option<String>,
    num_speculative_tokens: Option<usize>,
    prompt_lookup_max: Option<usize>,
    prompt_lookup_min: Option<usize>,
}

/// vLLM's defaults when neither bound is given.
const DEFAULT_LOOKUP: usize = 5;

/// Drafts per step at most: a verifying row costs as a prompt token does.
const MAX_SPECULATIVE_TOKENS: usize = 32;

impl NgramConfig {
    /// Parses vLLM's `--speculative-config` JSON. Only the `ngram` method
    /// (also spelled as the `model` `ngram` or `[ngram]`) is implemented:
    /// draft models, EAGLE and MTP are refused by name.
    pub fn parse(text: &str) -> Result<Self, String> {
        let json: SpeculativeJson = serde_json::from_str(text)
            .map_err(|e| format!("--speculative-config is not valid: {e}"))?;
        let method = json.method.as_deref().or(match json.model.as_deref() {
            Some("ngram" | "[ngram]") => Some("ngram"),
            other => other,
        });
        match method {
            Some("ngram" | "[ngram]") => {}
            Some(other) => {
                return Err(format!(
                    "--speculative-config: method {other:?} is not implemented (only \"ngram\")"
                ))
            }
            None => return Err("--speculative-config needs a method (\"ngram\")".to_owned()),
        }
        if json.method.is_some() {
            if let Some(model) = json.model {
                return Err(format!(
                    "--speculative-config: the ngram method takes no draft model ({model:?})"
                ));
            }
        }
        let k = json
            .num_speculative_tokens
            .ok_or("--speculative-config needs num_speculative_tokens")?;
        if !(1..=MAX_SPECULATIVE_TOKENS).contains(&k) {
            return Err(format!(
                "--speculative-config: num_speculative_tokens is {k}, it must be 1 to {MAX_SPECULATIVE_TOKENS}"
            ));
        }
        let (min, max) = match (json.prompt_lookup_min, json.prompt_lookup_max) {
            (None, None) => (DEFAULT_LOOKUP, DEFAULT_LOOKUP),
            (Some(min), None) => (min, min),
            (None, Some(max)) => (max, max),
            (Some(min), Some(max)) => (min, max),
        };
        if min < 1 || min > max {
            return Err(format!(
                "--speculative-config: prompt_lookup_min ({min}) must be at least 1 and at most prompt_lookup_max ({max})"
            ));
        }
        Ok(Self {
            num_speculative_tokens: k,
            prompt_lookup_min: min,
            prompt_lookup_max: max,
        })
    }
}

/// A sequence's n-gram lookup, kept across its steps: where each
/// `prompt_lookup_min`-gram of its tokens ends, indexed as the sequence
/// grows, so a lookup costs the occurrences of its suffix where a scan of
/// the whole sequence at every length costs its length: at 8k tokens a
/// step's lookup takes 0.06 µs against the scan's 67 µs, for every
/// drafting sequence before every step; indexing a prompt, 22 ns a token
/// once (`benches/ngram.rs`).
#[derive(Debug, Default)]
pub struct NgramIndex {
    /// The first and last end of each gram, by its tokens' key.
    grams: HashMap<u64, (u32, u32), BuildHasherDefault<KeyHasher>>,
    /// For each indexed end, the next end of the same gram (0: none, as no
    /// later end can be 0).
    next: Vec<u32>,
}

impl NgramIndex {
    /// The drafts for a sequence of `tokens` (prompt and output; the
    /// tokens of earlier calls with more after them, under the same
    /// `config`), at most `limit`: the tokens that followed the earliest
    /// earlier occurrence of its longest suffix of `prompt_lookup_min` to
    /// `prompt_lookup_max` tokens that has one, as vLLM's proposer takes
    /// them (they may run into the suffix itself). Empty when nothing
    /// matches.
    pub fn propose(&mut self, config: &NgramConfig, tokens: &[u32], limit: usize) -> Vec<u32> {
        let k = config.num_speculative_tokens.min(limit);
        let (min, len) = (config.prompt_lookup_min, tokens.len());
        if k == 0 || len <= min {
            return Vec::new();
        }
        // Every gram that ends before the last token (a token follows it).
        for end in self.next.len().max(min - 1)..len - 1 {
            self.next.resize(end + 1, 0);
            let key = gram_key(&tokens[end + 1 - min..=end]);
            let at = end as u32;
            match self.grams.entry(key) {
                Entry::Occupied(mut gram) => {
                    let last = std::mem::replace(&mut gram.get_mut().1, at);
                    self.next[last as usize] = at;
                }
                Entry::Vacant(gram) => {
                    gram.insert((at, at));
                }
            }
        }
        let Some(&(first, _)) = self.grams.get(&gram_key(&tokens[len - min..])) else {
            return Vec::new();
        };
        let longest = config.prompt_lookup_max.min(len - 1);
        // The longest match, the earliest of those: (length, end).
        let mut best: Option<(usize, usize)> = None;
        let mut end = first as usize;
        loop {
            let n = (0..longest.min(end + 1))
                .take_while(|&i| tokens[end - i] == tokens[len - 1 - i])
                .count();
            // A shorter match is another gram with the same key.
            if n >= min && best.is_none_or(|(most, _)| n > most) {
                best = Some((n, end));
                if n == longest {
                    break;
                }
            }
            match self.next[end] {
                0 => break,
                next => end = next as usize,
            }
        }
        best.map_or_else(Vec::new, |(_, end)| {
            tokens[end + 1..(end + 1 + k).min(len)].to_vec()
        })
    }
}

/// The key of a gram in [`NgramIndex`] (FxHash's mixing; grams with the
/// same key are told apart by their tokens).
fn gram_key(gram: &[u32]) -> u64 {
    gram.iter().fold(0, |h: u64, &t| {
        (h.rotate_left(5) ^ u64::from(t)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95)
    })
}

/// The hasher of [`NgramIndex`]'s keys, which are hashes already.
#[derive(Debug, Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    fn write_u64(&mut self, key: u64) {
        self.0 = key;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ngram(k: usize, min: usize, max: usize) -> NgramConfig {
        NgramConfig {
            num_speculative_tokens: k,
            prompt_lookup_min: min,
            prompt_lookup_max: max,
        }
    }

    /// The rule itself, a scan of the whole sequence at each length: the
    /// index must propose what it proposes.
    fn scan(config: &NgramConfig, tokens: &[u32], limit: usize) -> Vec<u32> {
        let k = config.num_speculative_tokens.min(limit);
        let len = tokens.len();
        if k == 0 {
            return Vec::new();
        }
        let longest = config.prompt_lookup_max.min(len.saturating_sub(1));
        for n in (config.prompt_lookup_min..=longest).rev() {
            let suffix = &tokens[len - n..];
            if let Some(at) = tokens[..len - 1].windows(n).position(|w| w == suffix) {
                let from = at + n;
                return tokens[from..(from + k).min(len)].to_vec();
            }
        }
        Vec::new()
    }

    /// A fresh index's proposal, checked against the scan's.
    fn propose(config: NgramConfig, tokens: &[u32], limit: usize) -> Vec<u32> {
        let drafts = NgramIndex::default().propose(&config, tokens, limit);
        assert_eq!(
            drafts,
            scan(&config, tokens, limit),
            "{config:?} {tokens:?}"
        );
        drafts
    }

    #[test]
    fn an_index_kept_as_the_sequence_grows_proposes_what_the_scan_does() {
        // Small vocabularies, so grams recur often and collide in length.
        let mut x = 12345_u64;
        let mut next = |n: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % n
        };
        let mut proposed = 0;
        for round in 0..200 {
            let config = ngram(
                1 + next(5) as usize,
                1 + next(3) as usize,
                3 + next(4) as usize,
            );
            let vocab = 2 + round % 4;
            let mut index = NgramIndex::default();
            let mut tokens = Vec::new();
            for _ in 0..120 {
                tokens.push(next(vocab) as u32);
                let limit = next(6) as usize;
                let drafts = index.propose(&config, &tokens, limit);
                assert_eq!(
                    drafts,
                    scan(&config, &tokens, limit),
                    "{config:?} {tokens:?}"
                );
                proposed += usize::from(!drafts.is_empty());
            }
        }
        assert!(proposed > 10_000, "{proposed} proposals");
    }

    #[test]
    fn the_longest_suffix_with_an_earlier_occurrence_proposes_what_followed_it() {
        // vLLM's docstring example: [4, 2, 3] has no earlier occurrence,
        // [2, 3] has one at 1, followed by 4, 2, 3 (into the suffix).
        assert_eq!(
            propose(ngram(4, 2, 3), &[1, 2, 3, 4, 2, 3], 10),
            vec![4, 2, 3]
        );
        // The earliest occurrence of the longest match.
        let tokens = [7, 8, 9, 1, 7, 8, 9, 2, 5, 7, 8, 9];
        assert_eq!(propose(ngram(2, 1, 3), &tokens, 10), vec![1, 7]);
        // A longer match wins over an earlier, shorter one.
        let tokens = [8, 9, 6, 7, 8, 9, 5, 7, 8, 9];
        assert_eq!(propose(ngram(1, 2, 3), &tokens, 10), vec![5]);
        assert_eq!(propose(ngram(1, 2, 2), &tokens, 10), vec![6]);
    }

    #[test]
    fn no_match_or_no_room_proposes_nothing() {
        assert!(propose(ngram(3, 2, 4), &[1, 2, 3, 4, 5], 10).is_empty());
        assert!(propose(ngram(3, 1, 1), &[1, 2, 1], 0).is_empty());
        assert!(propose(ngram(3, 2, 2), &[1], 10).is_empty());
        // The limit (the tokens the sequence may still generate) caps it.
        assert_eq!(propose(ngram(3, 1, 1), &[1, 2, 3, 1], 2), vec![2, 3]);
        // A suffix as long as the sequence has nothing before it.
        assert!(propose(ngram(3, 3, 3), &[1, 1, 1], 10).is_empty());
        assert_eq!(propose(ngram(3, 1, 3), &[1, 1, 1], 10), vec![1]);
    }

    #[test]
    fn vllm_json_parses_with_its_defaults_and_refuses_what_is_not_implemented() {
        let parsed = NgramConfig::parse(r#"{"method": "ngram", "num_speculative_tokens": 4}"#);
        assert_eq!(parsed, Ok(ngram(4, 5, 5)));
        let parsed = NgramConfig::parse(
            r#"{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}"#,
        );
        assert_eq!(parsed, Ok(ngram(3, 2, 4)));
        let parsed = NgramConfig::parse(
            r#"{"model": "[ngram]", "num_speculative_tokens": 2, "prompt_lookup_max": 3}"#,
        );
        assert_eq!(parsed, Ok(ngram(2, 3, 3)));
        for (json, says) in [
            (
                r#"{"method": "eagle", "num_speculative_tokens": 2}"#,
                "\"eagle\" is not implemented",
            ),
            (
                r#"{"model": "meta-llama/Llama-3.2-1B", "num_speculative_tokens": 2}"#,
                "is not implemented",
            ),
            (r#"{"method": "ngram"}"#, "needs num_speculative_tokens"),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 0}"#,
                "must be 1 to 32",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}"#,
                "at most prompt_lookup_max",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 1}"#,
                "draft_tensor_parallel_size",
            ),
            (r#"{"num_speculative_tokens": 2}"#, "needs a method"),
            ("ngram", "not valid"),
        ] {
            let error = NgramConfig::parse(json).unwrap_err();
            assert!(error.contains(says), "{json}: {error}");
        }
    }
}
