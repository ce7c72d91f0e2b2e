//! Sampling on the device (`kernels/cuda/sampling.cu`): per logits row the
//! host uploads a small parameter block, the token adjustments of penalties
//! and bans, and a structured-output mask (a bit a token); the kernel picks
//! the token and the log-probabilities; only those come back.

use kiln_kernels::cuda::{Device, DevicePtr, FunctionId, KernelArg, LaunchConfig};

use crate::runtime::sampling::{RowSampling, Sampled, MIN_TEMPERATURE};
use crate::runtime::TokenFeed;

/// Threads of a row's block: `KILN_SAMPLE_THREADS` in `sampling.cu`.
const SAMPLE_THREADS: u32 = 512;

/// Bytes of a row's `KilnSampleParams` (`sampling.cu`): 14 four-byte
/// fields.
const PARAMS_BYTES: usize = 56;

/// Most top log-probabilities a row may ask for (OpenAI allows 20).
pub const MAX_TOP: usize = 20;

/// Device buffers of the sampler, grown when a step needs more (the
/// serving engine reserves them for its largest step at start-up).
#[derive(Default)]
pub struct SampleBuffers {
    rows: usize,
    vocab: usize,
    adjust_capacity: usize,
    /// Mask words the `masks` buffer holds.
    mask_capacity: usize,
    work: DevicePtr,
    params: DevicePtr,
    adjust: DevicePtr,
    masks: DevicePtr,
    tokens: DevicePtr,
    logprobs: DevicePtr,
    top_ids: DevicePtr,
    top_logprobs: DevicePtr,
    /// Rows the last launch picked for (what a feed may read), and where
    /// their token ids are (`tokens`, or the logits GEMV's greedy picks).
    picked_rows: usize,
    picked: DevicePtr,
    feed: DevicePtr,
    feed_capacity: usize,
}

/// A sampling launched on the device: its picks come back in a readback of
/// [`QueuedSample::parts`], which [`QueuedSample::picks`] decodes.
pub struct QueuedSample {
    vocab: usize,
    /// Each row's count of top log-probabilities, `None` for none at all.
    logprobs: Vec<Option<usize>>,
    parts: Vec<(DevicePtr, usize)>,
}

impl SampleBuffers {
    /// Makes room for `rows` rows of `vocab` logits (and a mask each) and
    /// `adjustments` token adjustments.
    pub fn reserve(
        &mut self,
        device: &dyn Device,
        rows: usize,
        vocab: usize,
        adjustments: usize,
    ) -> Result<(), String> {
        let alloc = |bytes: usize| {
            device
                .alloc(bytes)
                .map_err(|e| format!("sampler buffers: {e}"))
        };
        if rows > self.rows || vocab > self.vocab {
            if self.rows > 0 {
                // A launched step may still read the buffers about to be freed.
                device
                    .synchronize()
                    .map_err(|e| format!("sampler buffers: {e}"))?;
            }
            let (rows, vocab) = (rows.max(self.rows), vocab.max(self.vocab));
            self.free_rows(device);
            // Two f32 rows a row: the adjusted logits and the weights of
            // a selection past the sorted candidates (`prefix_select`).
            self.work = alloc(rows * 2 * vocab * 4)?;
            self.params = alloc(rows * PARAMS_BYTES)?;
            self.tokens = alloc(rows * 4)?;
            self.logprobs = alloc(rows * 4)?;
            self.top_ids = alloc(rows * MAX_TOP * 4)?;
            self.top_logprobs = alloc(rows * MAX_TOP * 4)?;
            self.rows = rows;
            self.vocab = vocab;
        }
        grow(
            device,
            (&mut self.adjust, &mut self.adjust_capacity),
            adjustments,
            16,
        )
        .and_then(|()| {
            grow(
                device,
                (&mut self.masks, &mut self.mask_capacity),
                rows * vocab.div_ceil(32),
                4,
            )
        })
        .map_err(|e| format!("sampler buffers: {e}"))
    }

    /// Frees the per-row buffers and forgets them (a failed allocation
    /// afterwards leaves nothing to free twice).
    fn free_rows(&mut self, device: &dyn Device) {
        for ptr in [
            &mut self.work,
            &mut self.params,
            &mut self.tokens,
            &mut self.logprobs,
            &mut self.top_ids,
            &mut self.top_logprobs,
        ] {
            if *ptr != 0 {
                device.free(*ptr);
                *ptr = 0;
            }
        }
        self.rows = 0;
        self.vocab = 0;
        // Picks in the freed buffer are gone: no feed may read them.
        (self.picked_rows, self.picked) = (0, 0);
    }

    /// Frees everything.
    pub fn free(&mut self, device: &dyn Device) {
        self.free_rows(device);
        for ptr in [self.adjust, self.masks, self.feed] {
            if ptr != 0 {
                device.free(ptr);
            }
        }
        *self = Self::default();
    }

    /// Writes the last launch's picks into a step's token ids before it
    /// runs, as `feed` says, with `kernel` (`kiln_feed_tokens`); `tokens`
    /// holds `count` token ids (i64).
    pub fn feed(
        &mut self,
        device: &dyn Device,
        kernel: FunctionId,
        tokens: DevicePtr,
        count: usize,
        feed: &[TokenFeed],
    ) -> Result<(), String> {
        if let Some(bad) = feed
            .iter()
            .find(|f| f.row >= self.picked_rows || f.index >= count)
        {
            return Err(format!(
                "a token feed from row {} to token {} of a step of {count} tokens, after a step of {} picks",
                bad.row, bad.index, self.picked_rows
            ));
        }
        grow(
            device,
            (&mut self.feed, &mut self.feed_capacity),
            feed.len(),
            8,
        )
        .map_err(|e| format!("token feed: {e}"))?;
        let pairs: Vec<u8> = feed
            .iter()
            .flat_map(|f| [f.row as i32, f.index as i32])
            .flat_map(i32::to_le_bytes)
            .collect();
        let fail = |e: kiln_kernels::cuda::DeviceError| e.to_string();
        device.upload(self.feed, &pairs).map_err(fail)?;
        device
            .launch(
                kernel,
                LaunchConfig::elementwise(feed.len()),
                &[
                    KernelArg::Ptr(self.picked),
                    KernelArg::Ptr(self.feed),
                    KernelArg::Ptr(tokens),
                    KernelArg::I32(feed.len() as i32),
                ],
            )
            .map_err(fail)
    }

    /// Launches the pick of the token of each row of `logits` ([rows.len(),
    /// vocab] f32 at `logits`) with `kernel` (`kiln_sample`). `greedy`: the
    /// logits' GEMV wrote each row's greedy pick there (u32 ids), which
    /// stand when every row is greedy with nothing to adjust and no
    /// log-probabilities: then nothing is launched.
    pub fn launch(
        &mut self,
        device: &dyn Device,
        kernel: FunctionId,
        (logits, vocab): (DevicePtr, usize),
        rows: &[RowSampling],
        greedy: Option<DevicePtr>,
    ) -> Result<QueuedSample, String> {
        let mut queued = QueuedSample {
            vocab,
            logprobs: rows.iter().map(|r| r.logprobs).collect(),
            parts: Vec::new(),
        };
        if rows.is_empty() {
            self.picked_rows = 0;
            return Ok(queued);
        }
        // The kernel's test for a plain greedy row (`kiln_sample`).
        let plain_greedy = rows.iter().all(|row| {
            row.temperature < MIN_TEMPERATURE
                && row.adjustments.is_empty()
                && row.allowed.is_none()
                && row.logprobs.is_none()
        });
        if let Some(tokens) = greedy.filter(|_| plain_greedy) {
            (self.picked_rows, self.picked) = (rows.len(), tokens);
            queued.parts.push((tokens, rows.len() * 4));
            return Ok(queued);
        }
        let adjustments: usize = rows.iter().map(|r| r.adjustments.len()).sum();
        let mask_words = vocab.div_ceil(32);
        let masked = rows.iter().filter(|r| r.allowed.is_some()).count();
        self.reserve(device, rows.len(), vocab, adjustments.max(1))?;
        let mut params = Vec::with_capacity(rows.len() * PARAMS_BYTES);
        let mut adjust = Vec::with_capacity(adjustments * 16);
        let mut masks = Vec::with_capacity(masked * mask_words * 4);
        for row in rows {
            // Words past a short mask allow nothing.
            let mask = match &row.allowed {
                Some(words) => {
                    let first = masks.len() / 4;
                    let padded = words.iter().copied().chain(std::iter::repeat(0));
                    masks.extend(padded.take(mask_words).flat_map(u32::to_le_bytes));
                    first as i32
                }
                None => -1,
            };
            let begin = adjust.len() / 16;
            for a in &row.adjustments {
                let flags = i32::from(a.seen) | (i32::from(a.banned) << 1);
                for v in [a.token as i32, a.generated as i32, flags] {
                    adjust.extend(v.to_le_bytes());
                }
                adjust.extend(a.bias.to_le_bytes());
            }
            let end = adjust.len() / 16;
            let logprobs = row.logprobs.map_or(-1, |n| n.min(MAX_TOP) as i32);
            for v in [
                row.temperature,
                row.top_p,
                row.min_p,
                row.uniform,
                row.repetition,
                row.frequency,
                row.presence,
            ] {
                params.extend(v.to_le_bytes());
            }
            for v in [
                row.top_k.min(i32::MAX as usize) as i32,
                logprobs,
                begin as i32,
                end as i32,
                mask,
                row.draft
                    .map_or(-1, |d| d.token.min(i32::MAX as u32) as i32),
            ] {
                params.extend(v.to_le_bytes());
            }
            params.extend(row.draft.map_or(0.0, |d| d.again).to_le_bytes());
        }
        debug_assert_eq!(params.len(), rows.len() * PARAMS_BYTES);
        let fail = |e: kiln_kernels::cuda::DeviceError| e.to_string();
        device.upload(self.params, &params).map_err(fail)?;
        if !adjust.is_empty() {
            device.upload(self.adjust, &adjust).map_err(fail)?;
        }
        if !masks.is_empty() {
            device.upload(self.masks, &masks).map_err(fail)?;
        }
        device
            .launch(
                kernel,
                LaunchConfig::linear(rows.len() as u32, SAMPLE_THREADS),
                &[
                    KernelArg::Ptr(logits),
                    KernelArg::Ptr(self.work),
                    KernelArg::Ptr(self.params),
                    KernelArg::Ptr(self.adjust),
                    KernelArg::Ptr(self.masks),
                    KernelArg::I32(vocab as i32),
                    KernelArg::I32(MAX_TOP as i32),
                    KernelArg::Ptr(self.tokens),
                    KernelArg::Ptr(self.logprobs),
                    KernelArg::Ptr(self.top_ids),
                    KernelArg::Ptr(self.top_logprobs),
                ],
            )
            .map_err(fail)?;
        let n = rows.len();
        (self.picked_rows, self.picked) = (n, self.tokens);
        queued.parts.push((self.tokens, n * 4));
        if rows.iter().any(|r| r.logprobs.is_some()) {
            queued.parts.extend([
                (self.logprobs, n * 4),
                (self.top_ids, n * MAX_TOP * 4),
                (self.top_logprobs, n * MAX_TOP * 4),
            ]);
        }
        Ok(queued)
    }
}

/// Makes `buffer` (its address and capacity in items) hold at least
/// `needed` items of `item_bytes`, a power of two of them; the old buffer is
/// freed after queued work, which may still read it, is done.
fn grow(
    device: &dyn Device,
    (ptr, capacity): (&mut DevicePtr, &mut usize),
    needed: usize,
    item_bytes: usize,
) -> Result<(), kiln_kernels::cuda::DeviceError> {
    if needed <= *capacity {
        return Ok(());
    }
    if *ptr != 0 {
        device.synchronize()?;
        device.free(*ptr);
        (*ptr, *capacity) = (0, 0);
    }
    let items = needed.next_power_of_two();
    *ptr = device.alloc(items * item_bytes)?;
    *capacity = items;
    Ok(())
}

impl QueuedSample {
    /// The device ranges holding the picks, to read back in this order.
    pub fn parts(&self) -> &[(DevicePtr, usize)] {
        &self.parts
    }

    /// The picks, from the bytes of [`QueuedSample::parts`] read back.
    pub fn picks(&self, bytes: &[u8]) -> Result<Vec<Sampled>, String> {
        let expected: usize = self.parts.iter().map(|p| p.1).sum();
        if bytes.len() < expected {
            return Err(format!(
                "{} bytes of picks read back, {expected} expected",
                bytes.len()
            ));
        }
        let n = self.logprobs.len();
        let words: Vec<u32> = bytes[..expected]
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        // Tokens, then (when any row asked) log-probabilities and the top
        // ids and log-probabilities.
        let (tokens, rest) = words.split_at(n);
        if let Some(bad) = tokens.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(format!(
                "the sampler returned token {bad} of a vocabulary of {}",
                self.vocab
            ));
        }
        let (logprobs, tops) = rest.split_at(n.min(rest.len()));
        let (top_ids, top_logprobs) = tops.split_at(tops.len() / 2);
        Ok(self
            .logprobs
            .iter()
            .enumerate()
            .map(|(r, asked)| {
                let top = (0..asked.unwrap_or(0).min(MAX_TOP))
                    .map(|j| {
                        (
                            top_ids[r * MAX_TOP + j],
                            f32::from_bits(top_logprobs[r * MAX_TOP + j]),
                        )
                    })
                    .collect();
                Sampled {
                    token: tokens[r],
                    logprob: asked.map(|_| f32::from_bits(logprobs[r])),
                    top,
                }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kiln_kernels::cuda::emulator::Emulator;
    use kiln_kernels::cuda::sources;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::runtime::sampling::{self, sample_row, Draft, TokenAdjustment};

    /// The kernel picks what the host sampler picks, draw for draw: greedy
    /// and sampled rows with every filter, penalties, bans, ties, -inf
    /// logits and log-probabilities; draws and cuts among the likeliest
    /// tokens and past them; drafts kept and not.
    #[test]
    fn the_device_sampler_picks_what_the_host_sampler_picks() {
        // The emulator, or a GPU when KILN_TEST_CUDA_DEVICE names one.
        let cache = std::env::temp_dir().join("kiln-kernels");
        let device: Arc<dyn Device> = match std::env::var("KILN_TEST_CUDA_DEVICE") {
            Ok(name) => crate::device::open(name.parse().unwrap(), cache)
                .unwrap()
                .expect("a CUDA device"),
            Err(_) => Arc::new(Emulator::new(1 << 30, cache.join("emulator"))),
        };
        let names = sources::kernel_names(sources::SAMPLING.text);
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let kernel = device
            .load(sources::SAMPLING.name, sources::SAMPLING.text, &refs)
            .unwrap()[0];
        let mut rng = StdRng::seed_from_u64(5);
        let mut buffers = SampleBuffers::default();
        let mut checked = 0;
        // Sampled rows' drafts not kept, and kept.
        let mut drafts = [0; 2];
        for round in 0..12 {
            // Vocabularies larger than a block's threads many times over, so
            // greedy's one-pass pick meets ties across threads and within one
            // thread's stride: 4100 read 16 bytes at a time, 4099 (rows not
            // 16-byte aligned) a float at a time.
            let vocab: usize = [300, 4100, 4099][round % 3];
            let mut rows: Vec<RowSampling> = (0..6)
                .map(|r| {
                    let greedy = (round + r) % 5 == 0;
                    RowSampling {
                        temperature: match (greedy, r) {
                            (true, _) => 0.0,
                            // Below MIN_TEMPERATURE: greedy; then one that
                            // overflows the huge logits of row 5.
                            (false, 4) => 1e-6,
                            (false, 5) => 2e-5,
                            _ => rng.random_range(0.3..1.5),
                        },
                        top_k: [0, 1, 5, 40, 299, 1000][rng.random_range(0..6)],
                        top_p: [1.0, 0.9, 0.5, 0.05][rng.random_range(0..4)],
                        min_p: [0.0, 0.1, 0.5][rng.random_range(0..3)],
                        uniform: if r == 0 { 0.0 } else { rng.random::<f32>() },
                        repetition: [1.0, 1.3][rng.random_range(0..2)],
                        frequency: rng.random_range(-0.5..0.5),
                        presence: rng.random_range(-0.5..0.5),
                        // Even greedy rows adjust nothing: the one-pass
                        // pick of the raw row.
                        adjustments: (0..rng.random_range(0..8)
                            * usize::from(!greedy || r % 2 == 1))
                            .map(|_| {
                                let token = rng.random_range(0..vocab as u32);
                                let adjustment = TokenAdjustment {
                                    token,
                                    generated: rng.random_range(0..3),
                                    seen: rng.random(),
                                    banned: rng.random_range(0..10) == 0,
                                    bias: [0.0, 2.5, -1.0][rng.random_range(0..3)],
                                };
                                (token, adjustment)
                            })
                            .collect::<std::collections::BTreeMap<u32, TokenAdjustment>>()
                            .into_values()
                            .collect(),
                        logprobs: [None, Some(0), Some(3)][rng.random_range(0..3)],
                        // Row 3 has a structured-output mask: about a
                        // quarter of the tokens, always token 0 (whose logit
                        // is finite); every third round's mask stops short
                        // of the vocabulary's last 64 tokens (not allowed).
                        allowed: (r == 3).then(|| {
                            (0..vocab.div_ceil(32) - 2 * usize::from(round % 3 == 0))
                                .map(|w| {
                                    let bits = rng.random::<u32>() & rng.random::<u32>();
                                    if w == 0 {
                                        bits | 1
                                    } else {
                                        bits
                                    }
                                })
                                .collect()
                        }),
                        draft: None,
                    }
                })
                .collect();
            // A greedy row with a mask and nothing else (rounds 2 and 7) is
            // not the plain greedy pick: its largest logits (below) are
            // masked.
            if rows[3].temperature == 0.0 {
                rows[3].adjustments.clear();
                rows[3].logprobs = None;
                if let Some(mask) = &mut rows[3].allowed {
                    for t in [13, 2060] {
                        mask[t / 32] &= !(1 << (t % 32));
                    }
                }
            }
            // Row 1 samples the whole row with no cut: its draw lands among
            // the likeliest tokens (which the kernel sorts in shared memory)
            // or, at 0.7 over the large vocabularies' flat rows, past them
            // (not deeper: at 0.999 the host's sequential sum and the
            // device's passes over thousands of tail tokens round apart, as
            // they did before the candidates).
            rows[1] = RowSampling {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                uniform: [0.7, 0.3][round % 2],
                ..rows[1].clone()
            };
            // Coarse values make ties; some rows have -inf logits; row 5's
            // largest overflow when divided by its temperature.
            let mut logits: Vec<f32> = (0..rows.len() * vocab)
                .map(|i| match rng.random_range(0..40) {
                    0 if i % vocab != 0 => f32::NEG_INFINITY,
                    1 if i / vocab == 5 => 1e34,
                    _ => (rng.random_range(-40..40) as f32) / 8.0,
                })
                .collect();
            // Greedy rows of the large vocabularies hold their largest logit
            // twice, at 13 and 2060: one thread's elements in the one-pass
            // pick (quads 3 and 515 of 512 threads), where the first wins.
            for (r, row) in rows.iter().enumerate() {
                if row.temperature == 0.0 && vocab > 2060 {
                    logits[r * vocab + 13] = 9.0;
                    logits[r * vocab + 2060] = 9.0;
                }
            }
            // Rows 0 and 2 check a draft (speculative decoding): their
            // likeliest token, often kept (always by row 0's draw of 0), or
            // any token, mostly not.
            for r in [0, 2] {
                let row = &logits[r * vocab..(r + 1) * vocab];
                let token = match round % 2 {
                    0 => sampling::argmax(row),
                    _ => rng.random_range(0..vocab as u32),
                };
                let again = rng.random_range(0.0..0.7);
                rows[r].draft = Some(Draft { token, again });
            }
            let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
            let ptr = device.alloc(bytes.len()).unwrap();
            device.upload(ptr, &bytes).unwrap();
            let queued = buffers
                .launch(device.as_ref(), kernel, (ptr, vocab), &rows, None)
                .unwrap();
            let readback = device.download_async(queued.parts()).unwrap();
            let got = queued
                .picks(&device.wait_readback(readback).unwrap())
                .unwrap();
            device.free(ptr);
            for (r, (row, got)) in rows.iter().zip(got).enumerate() {
                let want = sample_row(&logits[r * vocab..(r + 1) * vocab], row);
                assert_eq!(got.token, want.token, "round {round} row {r}: {row:?}");
                if let Some(draft) = row.draft.filter(|_| row.temperature >= MIN_TEMPERATURE) {
                    drafts[usize::from(got.token == draft.token)] += 1;
                }
                let (word, bit) = (got.token as usize / 32, got.token % 32);
                assert!(
                    row.allowed
                        .as_ref()
                        .is_none_or(|mask| { mask.get(word).is_some_and(|w| w >> bit & 1 == 1) }),
                    "round {round} row {r}: a masked token"
                );
                if let (Some(a), Some(b)) = (got.logprob, want.logprob) {
                    assert!((a - b).abs() < 1e-5, "logprob {a} vs {b}");
                }
                assert_eq!(got.top.len(), want.top.len());
                for (&(ta, la), &(tb, lb)) in got.top.iter().zip(&want.top) {
                    assert_eq!(ta, tb, "round {round} row {r} top");
                    assert!((la - lb).abs() < 1e-5);
                }
                checked += 1;
            }
        }
        buffers.free(device.as_ref());
        assert_eq!(checked, 72);
        eprintln!("drafts not kept, kept: {drafts:?}");
        assert!(
            drafts[0] > 2 && drafts[1] > 2,
            "drafts not kept, kept: {drafts:?}"
        );
    }
}
