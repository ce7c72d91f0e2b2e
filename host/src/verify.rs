//! Comparing a model's logits with reference logits: what `host verify`
//! computes. A reference directory holds, per prompt, `<name>.ids.json`
//! (`{"ids": [...]}`), `<name>.logits.npy` (float32 `[len(ids), vocab]`,
//! teacher-forced) and optionally `<name>.greedy.json` (`{"new_ids": [...]}`),
//! as `tests/real_models/gen_references.py` writes them with transformers.
//! For an embedding model the directory holds, per text, `<name>.ids.json`
//! and `<name>.embedding.npy` (float32 `[1, dim]`: the pooled embedding, as
//! sentence-transformers' `encode` gives it).

use std::path::Path;

use anyhow::{ensure, Context};
use serde::{Deserialize, Serialize};

use crate::engine::npy::{read_matrix, Matrix};
use crate::engine::sampling::argmax;

/// One prompt of a reference directory.
#[derive(Clone, Debug)]
pub struct ReferencePrompt {
    /// The file stem, e.g. `chat`.
    pub name: String,
    /// The prompt's token ids.
    pub ids: Vec<u32>,
    /// Teacher-forced logits `[ids.len(), vocab]`.
    pub logits: Matrix,
    /// The reference's greedy continuation, when recorded.
    pub greedy: Option<Vec<u32>>,
}

#[derive(Deserialize)]
struct IdsFile {
    ids: Vec<u32>,
}

#[derive(Deserialize)]
struct GreedyFile {
    new_ids: Vec<u32>,
}

/// What a reference directory holds: logits per prompt, or embeddings per
/// text (when its first `<name>.ids.json` has a `<name>.embedding.npy`).
#[derive(Clone, Debug)]
pub enum Reference {
    /// Teacher-forced logits (a generator's reference).
    Logits(Vec<ReferencePrompt>),
    /// Pooled embeddings (an embedding model's reference).
    Embeddings(Vec<EmbeddingReference>),
}

/// Reads a reference directory of either kind, every entry in name order.
pub fn read_reference(dir: &Path) -> anyhow::Result<Reference> {
    let names = reference_names(dir)?;
    if dir.join(format!("{}.embedding.npy", names[0])).is_file() {
        let texts = names.into_iter().map(|name| read_embedding(dir, name));
        return Ok(Reference::Embeddings(texts.collect::<anyhow::Result<_>>()?));
    }
    let prompts = names.into_iter().map(|name| read_prompt(dir, name));
    Ok(Reference::Logits(prompts.collect::<anyhow::Result<_>>()?))
}

/// The stems of the directory's `<name>.ids.json` files, sorted; at least one.
fn reference_names(dir: &Path) -> anyhow::Result<Vec<String>> {
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read the reference directory {}", dir.display()))?;
    let mut names = Vec::new();
    for entry in entries {
        let file_name = entry?.file_name();
        if let Some(name) = file_name.to_str().and_then(|n| n.strip_suffix(".ids.json")) {
            names.push(name.to_owned());
        }
    }
    names.sort();
    ensure!(
        !names.is_empty(),
        "{} holds no `<prompt>.ids.json` files",
        dir.display()
    );
    Ok(names)
}

/// Prompt `name`: its ids, logits and (if recorded) greedy continuation.
fn read_prompt(dir: &Path, name: String) -> anyhow::Result<ReferencePrompt> {
    let ids: IdsFile = read_json(&dir.join(format!("{name}.ids.json")))?;
    let logits = read_matrix(&dir.join(format!("{name}.logits.npy")))?;
    ensure!(
        !ids.ids.is_empty() && logits.rows == ids.ids.len(),
        "{name}: {} logits rows for {} prompt ids",
        logits.rows,
        ids.ids.len()
    );
    let greedy_path = dir.join(format!("{name}.greedy.json"));
    let greedy = match greedy_path.is_file() {
        true => Some(read_json::<GreedyFile>(&greedy_path)?.new_ids),
        false => None,
    };
    Ok(ReferencePrompt {
        name,
        ids: ids.ids,
        logits,
        greedy,
    })
}

/// One text of an embedding reference directory.
#[derive(Clone, Debug)]
pub struct EmbeddingReference {
    /// The file stem.
    pub name: String,
    /// The text's token ids.
    pub ids: Vec<u32>,
    /// The reference embedding.
    pub embedding: Vec<f32>,
}

/// Text `name`: its ids and its embedding (`[1, dim]`).
fn read_embedding(dir: &Path, name: String) -> anyhow::Result<EmbeddingReference> {
    let ids: IdsFile = read_json(&dir.join(format!("{name}.ids.json")))?;
    let matrix = read_matrix(&dir.join(format!("{name}.embedding.npy")))?;
    ensure!(
        !ids.ids.is_empty() && matrix.rows == 1,
        "{name}: expected one embedding row for a non-empty text, got {} rows",
        matrix.rows
    );
    Ok(EmbeddingReference {
        name,
        ids: ids.ids,
        embedding: matrix.data,
    })
}

/// How one embedding compares with the reference.
#[derive(Clone, Debug, Serialize)]
pub struct EmbeddingComparison {
    /// Dimensions compared.
    pub dimensions: usize,
    /// Largest |Kiln − reference|.
    pub max_abs_diff: f64,
    /// Cosine similarity of the two.
    pub cosine: f64,
    /// With a tolerance: the largest |Δ| / band (≤ 1 passes).
    pub worst_band_ratio: Option<f64>,
}

/// Compares Kiln's embedding with the reference's.
pub fn compare_embedding(
    kiln: &[f32],
    reference: &[f32],
    tolerance: Option<Tolerance>,
) -> anyhow::Result<EmbeddingComparison> {
    ensure!(
        kiln.len() == reference.len(),
        "Kiln's embedding has {} dimensions, the reference's {}",
        kiln.len(),
        reference.len()
    );
    let (mut dot, mut kk, mut rr, mut max_abs_diff) = (0f64, 0f64, 0f64, 0f64);
    let mut worst = 0f64;
    for (&k, &r) in kiln.iter().zip(reference) {
        let (k64, r64) = (f64::from(k), f64::from(r));
        dot += k64 * r64;
        kk += k64 * k64;
        rr += r64 * r64;
        let diff = (k64 - r64).abs();
        max_abs_diff = max_abs_diff.max(diff);
        if let Some(t) = tolerance {
            worst = worst.max(diff / t.band(r));
        }
    }
    Ok(EmbeddingComparison {
        dimensions: kiln.len(),
        max_abs_diff,
        cosine: dot / (kk.sqrt() * rr.sqrt()).max(f64::MIN_POSITIVE),
        worst_band_ratio: tolerance.map(|_| worst),
    })
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is malformed", path.display()))
}

/// The tolerance band `atol + rtol·|reference|`.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Tolerance {
    /// Absolute part.
    pub atol: f64,
    /// Relative part.
    pub rtol: f64,
}

impl Tolerance {
    fn band(&self, reference: f32) -> f64 {
        self.atol + self.rtol * f64::from(reference).abs()
    }
}

/// How one prompt's logits compare with the reference.
#[derive(Clone, Debug, Serialize)]
pub struct LogitsComparison {
    /// Positions compared.
    pub positions: usize,
    /// Largest |Kiln − reference| over every position and vocabulary entry.
    pub max_abs_diff: f64,
    /// Where it occurs: (position, token id).
    pub max_abs_diff_at: (usize, usize),
    /// Positions whose argmax agrees.
    pub top1_agree: usize,
    /// Mean KL(reference ‖ Kiln) per position, in nats.
    pub mean_kl: f64,
    /// Largest per-position KL.
    pub max_kl: f64,
    /// With a tolerance: the largest |Δ| / band (≤ 1 passes).
    pub worst_band_ratio: Option<f64>,
    /// With a tolerance: positions whose argmax differs although the
    /// reference's top-2 margin exceeds twice the band there.
    pub clear_top1_misses: Vec<usize>,
}

impl LogitsComparison {
    /// Top-1 agreement as a fraction.
    pub fn top1_rate(&self) -> f64 {
        self.top1_agree as f64 / self.positions.max(1) as f64
    }
}

/// Compares Kiln's logits with the reference's, position by position.
pub fn compare_logits(
    kiln: &Matrix,
    reference: &Matrix,
    tolerance: Option<Tolerance>,
) -> anyhow::Result<LogitsComparison> {
    ensure!(
        (kiln.rows, kiln.cols) == (reference.rows, reference.cols),
        "Kiln's logits are [{}, {}], the reference's [{}, {}]",
        kiln.rows,
        kiln.cols,
        reference.rows,
        reference.cols
    );
    let mut report = LogitsComparison {
        positions: reference.rows,
        max_abs_diff: 0.0,
        max_abs_diff_at: (0, 0),
        top1_agree: 0,
        mean_kl: 0.0,
        max_kl: 0.0,
        worst_band_ratio: tolerance.map(|_| 0.0),
        clear_top1_misses: Vec::new(),
    };
    for r in 0..reference.rows {
        let (k, e) = (kiln.row(r), reference.row(r));
        for (c, (&kv, &ev)) in k.iter().zip(e).enumerate() {
            let diff = (f64::from(kv) - f64::from(ev)).abs();
            if diff > report.max_abs_diff || diff.is_nan() {
                report.max_abs_diff = diff;
                report.max_abs_diff_at = (r, c);
            }
            if let (Some(t), Some(ratio)) = (tolerance, report.worst_band_ratio.as_mut()) {
                *ratio = ratio.max(diff / t.band(ev));
            }
        }
        let reference_top = argmax(e);
        if argmax(k) == reference_top {
            report.top1_agree += 1;
        } else if let Some(t) = tolerance {
            if top2_margin(e) > 2.0 * t.band(e[reference_top as usize]) {
                report.clear_top1_misses.push(r);
            }
        }
        let kl = kl_divergence(e, k);
        report.mean_kl += kl;
        report.max_kl = report.max_kl.max(kl);
    }
    report.mean_kl /= reference.rows.max(1) as f64;
    Ok(report)
}

/// Top-1 minus top-2 of a row.
fn top2_margin(row: &[f32]) -> f64 {
    let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in row {
        if v > first {
            second = first;
            first = v;
        } else if v > second {
            second = v;
        }
    }
    f64::from(first) - f64::from(second)
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row
        .iter()
        .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
    let sum: f64 = row.iter().map(|&v| (f64::from(v) - max).exp()).sum();
    let log_z = max + sum.ln();
    row.iter().map(|&v| f64::from(v) - log_z).collect()
}

/// KL(p ‖ q) of the softmax distributions of two logits rows, in nats.
pub fn kl_divergence(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let (p, q) = (log_softmax(p_logits), log_softmax(q_logits));
    p.iter()
        .zip(&q)
        .map(|(&lp, &lq)| lp.exp() * (lp - lq))
        .sum::<f64>()
        .max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(rows: &[&[f32]]) -> Matrix {
        Matrix {
            rows: rows.len(),
            cols: rows[0].len(),
            data: rows.iter().flat_map(|r| r.iter().copied()).collect(),
        }
    }

    #[test]
    fn identical_logits_agree_everywhere() {
        let m = matrix(&[&[1.0, 3.0, 2.0], &[0.5, 0.1, 0.2]]);
        let t = Tolerance {
            atol: 1e-3,
            rtol: 0.0,
        };
        let report = compare_logits(&m, &m, Some(t)).unwrap();
        assert_eq!((report.max_abs_diff, report.top1_agree), (0.0, 2));
        assert!(report.mean_kl.abs() < 1e-12);
        assert_eq!(report.worst_band_ratio, Some(0.0));
    }

    #[test]
    fn differences_are_located_and_misses_classified() {
        let reference = matrix(&[&[1.0, 3.0, 2.0], &[1.0, 1.0005, 0.0]]);
        let kiln = matrix(&[&[1.0, 2.0, 2.5], &[1.0006, 1.0, 0.0]]);
        let t = Tolerance {
            atol: 1e-3,
            rtol: 0.0,
        };
        let report = compare_logits(&kiln, &reference, Some(t)).unwrap();
        assert_eq!(report.max_abs_diff_at, (0, 1));
        assert!((report.max_abs_diff - 1.0).abs() < 1e-6);
        assert_eq!(report.top1_agree, 0);
        // Position 1's reference margin (5e-4) is within twice the band: a near tie.
        assert_eq!(report.clear_top1_misses, [0]);
        assert!(report.mean_kl > 0.0 && report.max_kl >= report.mean_kl);

        let wrong = matrix(&[&[1.0, 2.0]]);
        let err = compare_logits(&wrong, &reference, None).unwrap_err();
        assert!(err.to_string().contains("[1, 2], the reference's [2, 3]"));
    }

    #[test]
    fn kl_of_known_distributions() {
        // p = softmax([0, ln 3]) = (1/4, 3/4); q uniform: KL = Σ p ln(2p).
        let p = [0.0, 3f32.ln()];
        let expected = 0.25 * (0.5f64).ln() + 0.75 * (1.5f64).ln();
        assert!((kl_divergence(&p, &[0.0, 0.0]) - expected).abs() < 1e-6);
    }
}
