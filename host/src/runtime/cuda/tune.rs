//! How the decode GEMV splits each matrix's rows among warps, chosen once
//! at load. `kernels/cuda/gemv.cuh` has every GEMV in three splits (one,
//! two or four warps per row); which streams a shape's weights fastest
//! depends on the card, the rows and the row length, so on a GPU each
//! distinct launch shape of the program is timed in every split over all of
//! its matrices (every layer's, as a decode step reads them: the card's L2
//! cannot hold them, so the timing sees memory, not cache) and the fastest
//! kept. The emulator, where time says nothing of a GPU, uses one warp per
//! row unless told otherwise.

use std::collections::HashMap;
use std::time::Instant;

use kiln_kernels::cuda::{Device, DeviceError, DevicePtr, FunctionId, KernelArg, LaunchConfig};

use super::fusion::GatedActivation;
use super::gemv::{gemv_max_rows, group_arg, GemvGroup, GEMV_WARPS};
use super::measure::with_buffers;
use super::plan::{HandKernels, StepPlan};
use super::weights::DeviceMatrix;

/// Warps per row of the GEMV kernels and their name suffixes.
pub const SPLITS: [(usize, &str); 3] = [(1, ""), (2, "_s2"), (4, "_s4")];

/// How the decode GEMV's split of a row among warps is chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GemvSplits {
    /// Timed on a GPU, one warp per row on the emulator.
    #[default]
    Auto,
    /// Every launch shape timed in every split at load; the fastest kept.
    Timed,
    /// The same split (1, 2 or 4 warps per row) for every product.
    Fixed(usize),
}

impl GemvSplits {
    /// `KILN_GEMV_SPLIT` (see [`GemvSplits::parse`]), else `Auto`.
    pub fn from_env() -> Result<Self, String> {
        std::env::var("KILN_GEMV_SPLIT").map_or(Ok(Self::Auto), |v| Self::parse(&v))
    }

    /// `1`, `2` or `4`: that split everywhere (as a benchmark compares
    /// them); `timed`: timed even on the emulator.
    pub fn parse(value: &str) -> Result<Self, String> {
        match value.parse::<usize>() {
            _ if value == "timed" => Ok(Self::Timed),
            Ok(n) if SPLITS.iter().any(|&(s, _)| s == n) => Ok(Self::Fixed(n)),
            _ => Err(format!(
                "KILN_GEMV_SPLIT={value}: expected 1, 2, 4 or timed (warps per row of the decode GEMV)"
            )),
        }
    }
}

/// One GEMV launch shape: the kernel (its one-warp-per-row name) and the
/// rows and row length of the matrices it covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemvShape {
    /// The kernel's name without a split suffix.
    pub kernel: &'static str,
    /// Rows of all the launch's matrices together.
    pub rows: usize,
    /// Row length.
    pub k: usize,
    /// Rows paired in blocks (`KilnGemvGroup`).
    pub pairs: RowPairs,
}

/// Which rows of a GEMV launch its blocks hold in pairs (`KilnGemvGroup`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowPairs {
    /// None: a block holds any rows.
    Unpaired,
    /// A gated MLP's gate and up, row for row.
    Gated,
    /// q's and k's rows rotated together.
    Rotated,
}

/// A launch's kernel and its warps per row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemvChoice {
    /// The kernel.
    pub function: FunctionId,
    /// Warps per row.
    pub split: usize,
    /// Warps per block.
    pub warps: usize,
}

impl GemvChoice {
    /// `split` warps per row in blocks of [`GEMV_WARPS`], or of two rows
    /// for paired launches (gate's and up's rows, or a rotation's, in a
    /// block).
    pub fn new(function: FunctionId, split: usize, paired: bool) -> Self {
        let warps = match paired {
            true => GEMV_WARPS.max(2 * split),
            false => GEMV_WARPS,
        };
        Self {
            function,
            split,
            warps,
        }
    }

    /// Its launch for `rows` rows.
    pub fn config(&self, rows: usize) -> LaunchConfig {
        let rows_per_block = self.warps / self.split;
        LaunchConfig::linear(rows.div_ceil(rows_per_block) as u32, 32 * self.warps as u32)
    }
}

/// The split of every GEMV launch shape of a program.
#[derive(Clone, Debug, Default)]
pub struct GemvChoices {
    chosen: HashMap<GemvShape, GemvChoice>,
}

impl GemvChoices {
    /// The choice for `shape`; one warp per row for a shape never seen.
    pub fn get(&self, shape: &GemvShape, hand: &HandKernels) -> GemvChoice {
        let paired = shape.pairs != RowPairs::Unpaired;
        let one_per_row = || GemvChoice::new(hand[shape.kernel], 1, paired);
        self.chosen.get(shape).copied().unwrap_or_else(one_per_row)
    }

    /// How many launch shapes use each split, in [`SPLITS`]' order.
    pub fn counts(&self) -> [usize; SPLITS.len()] {
        let mut counts = [0; SPLITS.len()];
        for choice in self.chosen.values() {
            if let Some(i) = SPLITS.iter().position(|&(s, _)| s == choice.split) {
                counts[i] += 1;
            }
        }
        counts
    }
}

/// Every launch of one GEMV shape in a program: the matrices of each (a
/// list sharing x) and the rows of x its kernel is made for.
struct ShapeLaunches {
    x_rows: usize,
    matrices: Vec<Vec<DeviceMatrix>>,
}

/// The launches of each GEMV shape in `steps`, for one and for several rows
/// of x.
fn launches(steps: &[StepPlan]) -> HashMap<GemvShape, ShapeLaunches> {
    let mut shapes: HashMap<GemvShape, ShapeLaunches> = HashMap::new();
    for step in steps {
        let (members, pairs): (Vec<DeviceMatrix>, RowPairs) = match step {
            StepPlan::Linear(w) => (vec![*w], RowPairs::Unpaired),
            StepPlan::LinearGroup {
                members,
                gated,
                rotation,
                ..
            } => {
                let pairs = match (gated, rotation) {
                    (Some(_), _) => RowPairs::Gated,
                    (None, Some(_)) => RowPairs::Rotated,
                    (None, None) => RowPairs::Unpaired,
                };
                (members.iter().map(|(w, _)| *w).collect(), pairs)
            }
            _ => continue,
        };
        let Some(group) = GemvGroup::of(&members) else {
            continue;
        };
        for x_rows in [1, gemv_max_rows(&group.first)] {
            if let Some(kernel) = group.kernel(x_rows) {
                let shape = GemvShape {
                    kernel,
                    rows: members.iter().map(|w| w.rows).sum(),
                    k: group.first.cols,
                    pairs,
                };
                let entry = shapes.entry(shape).or_insert_with(|| ShapeLaunches {
                    x_rows,
                    matrices: Vec::new(),
                });
                entry.matrices.push(members.clone());
            }
        }
    }
    shapes
}

/// The choices for `steps`: `splits` says whether to time them on
/// `device` (`Auto` times them where `gpu`) or to fix one split. A shape
/// whose timing fails (no memory left for its scratch) keeps one warp per
/// row, with a warning.
pub fn choose(
    device: &dyn Device,
    hand: &HandKernels,
    steps: &[StepPlan],
    splits: GemvSplits,
    gpu: bool,
) -> Result<GemvChoices, String> {
    let timed = splits == GemvSplits::Timed || (splits == GemvSplits::Auto && gpu);
    let resolve = |shape: &GemvShape, split: usize| -> Result<GemvChoice, String> {
        let (_, suffix) = SPLITS
            .iter()
            .find(|&&(s, _)| s == split)
            .ok_or_else(|| format!("no GEMV kernel with {split} warps per row"))?;
        let name = format!("{}{suffix}", shape.kernel);
        let function = *hand
            .get(&name)
            .ok_or_else(|| format!("no GEMV kernel {name}"))?;
        Ok(GemvChoice::new(
            function,
            split,
            shape.pairs != RowPairs::Unpaired,
        ))
    };
    let mut chosen = HashMap::new();
    for (shape, shape_launches) in launches(steps) {
        let choice = match splits {
            GemvSplits::Fixed(split) => resolve(&shape, split)?,
            _ if !timed => resolve(&shape, 1)?,
            _ => {
                let candidates = SPLITS
                    .iter()
                    .map(|&(split, _)| resolve(&shape, split))
                    .collect::<Result<Vec<_>, _>>()?;
                match fastest(device, &shape, &shape_launches, &candidates) {
                    Ok(choice) => choice,
                    Err(e) => {
                        log::warn!(
                            "timing the GEMV {} ({} rows of {}): {e}; one warp per row",
                            shape.kernel,
                            shape.rows,
                            shape.k
                        );
                        candidates[0]
                    }
                }
            }
        };
        chosen.insert(shape, choice);
    }
    let choices = GemvChoices { chosen };
    if timed {
        let [one, two, four] = choices.counts();
        log::info!(
            "decode GEMV launch shapes by warps per row, timed: {one} with 1, {two} with 2, {four} with 4"
        );
    }
    Ok(choices)
}

/// The fastest of `candidates` over every launch of `shape` (`x_rows` rows
/// of x), each timed on the same zeroed x and scratch outputs.
fn fastest(
    device: &dyn Device,
    shape: &GemvShape,
    launches: &ShapeLaunches,
    candidates: &[GemvChoice],
) -> Result<GemvChoice, DeviceError> {
    let widest = launches.matrices.iter().flatten().map(|w| w.rows).max();
    let weight_bytes: usize = launches.matrices.iter().flatten().map(|w| w.bytes()).sum();
    let x_rows = launches.x_rows;
    let sizes = [x_rows * shape.k * 4, x_rows * widest.unwrap_or(1) * 4];
    let (choice, report) = with_buffers(device, &sizes, |buffers| {
        let mut best: Option<(f64, GemvChoice)> = None;
        let mut report = Vec::new();
        for &choice in candidates {
            let seconds = time_launches(device, shape, launches, choice, buffers)?;
            let rate = weight_bytes as f64 / seconds / 1e12;
            report.push(format!(
                "{}: {:.1} µs, {rate:.2} TB/s",
                choice.split,
                seconds * 1e6
            ));
            if best.is_none_or(|(b, _)| seconds < b) {
                best = Some((seconds, choice));
            }
        }
        let (_, choice) = best.ok_or_else(|| DeviceError::new("no GEMV kernel to time"))?;
        Ok((choice, report))
    })?;
    log::debug!(
        "GEMV {} {} rows of {} ×{} launches ({weight_bytes} bytes of weights): warps per row {} ({})",
        shape.kernel,
        shape.rows,
        shape.k,
        launches.matrices.len(),
        choice.split,
        report.join(", ")
    );
    Ok(choice)
}

/// Seconds for one pass of `choice` over every launch of `shape` (the best
/// of three after a warm-up), with x and the outputs in `buffers`.
fn time_launches(
    device: &dyn Device,
    shape: &GemvShape,
    launches: &ShapeLaunches,
    choice: GemvChoice,
    buffers: &[DevicePtr],
) -> Result<f64, DeviceError> {
    let (x, out) = (buffers[0], buffers[1]);
    let config = choice.config(shape.rows);
    let pass = || {
        launches.matrices.iter().try_for_each(|members| {
            let group: Vec<(DeviceMatrix, DevicePtr)> = members.iter().map(|w| (*w, out)).collect();
            // Any activation costs the same: one per output, after the rows;
            // a rotation is timed as the plain group (its rows are not
            // valid positions here), in its paired blocks.
            let activation = (shape.pairs == RowPairs::Gated).then_some(GatedActivation::Silu);
            let args = [
                group_arg(&group, activation, None, None, (None, None)),
                KernelArg::Ptr(x),
                KernelArg::I32(launches.x_rows as i32),
                KernelArg::I32(shape.k as i32),
            ];
            device.launch(choice.function, config, &args)
        })
    };
    pass()?;
    device.synchronize()?;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let started = Instant::now();
        pass()?;
        device.synchronize()?;
        best = best.min(started.elapsed().as_secs_f64());
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_are_parsed_and_others_refused_by_name() {
        assert_eq!(GemvSplits::parse("timed"), Ok(GemvSplits::Timed));
        for n in [1, 2, 4] {
            assert_eq!(GemvSplits::parse(&n.to_string()), Ok(GemvSplits::Fixed(n)));
        }
        for bad in ["3", "0", "8", "", "fast"] {
            let err = GemvSplits::parse(bad).unwrap_err();
            assert!(err.contains(&format!("KILN_GEMV_SPLIT={bad}:")), "{err}");
        }
    }

    #[test]
    fn a_split_launches_enough_blocks_for_its_rows() {
        let choice = |split| GemvChoice::new(FunctionId(0), split, false);
        // Four warps a block: four rows, two or one.
        assert_eq!(choice(1).config(9).grid.0, 3);
        assert_eq!(choice(2).config(9).grid.0, 5);
        assert_eq!(choice(4).config(9).grid.0, 9);
        assert_eq!(choice(4).config(9).block.0, 128);
        // Gated: an even number of rows a block (gate's and up's pairs),
        // eight warps when each row takes four.
        let gated = |split| GemvChoice::new(FunctionId(0), split, true).config(12);
        assert_eq!((gated(1).grid.0, gated(1).block.0), (3, 128));
        assert_eq!((gated(2).grid.0, gated(2).block.0), (6, 128));
        assert_eq!((gated(4).grid.0, gated(4).block.0), (6, 256));
    }
}
