//! Running a product: its weight rows split into tasks over the thread
//! pool, and each task's rows through the single-row, multi-row or panel
//! kernels.

use std::cell::RefCell;

use super::{Aligned, Kernel, MultiKernel, Panel, MAX_MULTI_KERNELS};
#[cfg(target_arch = "x86_64")]
use super::{Int8Panel, Int8Weights};

/// Rows computed for every activation row before moving on, so that they stay
/// in L1 while the activations stream past.
const ROW_TILE: usize = 8;
/// Weight bytes a multi-row kernel is given at once (at least
/// [`ROW_TILE`] rows): each group of activation rows runs over them before
/// the next group, so they stay in L2 while a group's activations stay in
/// L1. Bigger tiles also spread the kernel's set-up over more rows.
const MULTI_TILE_BYTES: usize = 256 << 10;

/// Values of weights the int8 panel kernels decode at once (a byte each, two for
/// Q4_K and Q6_K): they stay in L2 while every activation row passes.
#[cfg(target_arch = "x86_64")]
const INT8_TILE_BYTES: usize = 256 << 10;

thread_local! {
    /// Each thread's weights decoded for the panel kernels.
    static PANEL_SCRATCH: RefCell<Aligned> = RefCell::default();
    /// Each thread's weights decoded for the int8 panel kernels.
    #[cfg(target_arch = "x86_64")]
    static INT8_SCRATCH: RefCell<Int8Weights> = RefCell::default();
}

/// Kernels that compute every row of a product from weights decoded once
/// per tile, with the activations laid out for them.
pub(super) enum Panels<'a, A> {
    Exact(Panel, &'a [f32]),
    /// With the values in a row; the job's activations are padded to a
    /// multiple of 16 rows.
    #[cfg(target_arch = "x86_64")]
    Int8(Int8Panel<A>, usize),
}

/// A product to run: the kernel, the weights, and the prepared activations.
pub(super) struct Job<'a, A> {
    pub(super) kernel: Kernel<A>,
    pub(super) multi: [Option<MultiKernel<A>>; MAX_MULTI_KERNELS],
    /// Panel kernels and the activations laid out for them: then they
    /// compute every row.
    pub(super) panel: Option<Panels<'a, A>>,
    /// What a task's rows are a multiple of (but for the last task's):
    /// the rows the kernels compute together.
    pub(super) row_align: usize,
    pub(super) weight: &'a [u8],
    pub(super) row_bytes: usize,
    /// `m` rows of `act_len` values or blocks each.
    pub(super) acts: &'a [A],
    pub(super) act_len: usize,
}

impl<A: Sync> Job<'_, A> {
    /// Computes weight rows `r0..r0 + outs[i].len()` for every activation
    /// row `i`, writing `outs[i][r - r0]`: activation rows in groups of the
    /// multi-row kernels' sizes while they have enough, the rest one by one.
    fn rows(&self, r0: usize, outs: &mut [&mut [f32]]) {
        match self.panel {
            Some(Panels::Exact(panel, packed)) => return self.panel_rows(panel, packed, r0, outs),
            #[cfg(target_arch = "x86_64")]
            Some(Panels::Int8(amx, cols)) => return self.int8_rows(amx, cols, r0, outs),
            None => {}
        }
        let n = outs.first().map_or(0, |o| o.len());
        let mut done = 0;
        for k in self.multi.iter().flatten() {
            let groups = (outs.len() - done) / k.acts;
            if groups > 0 {
                let end = done + groups * k.acts;
                self.multi_rows(k, r0, done, &mut outs[done..end]);
                done = end;
            }
        }
        if done == outs.len() {
            return;
        }
        // One activation row left: the kernel gets all rows at once, so that
        // it can prefetch ahead across them.
        let tile = if outs.len() - done == 1 {
            n.max(1)
        } else {
            ROW_TILE
        };
        for t0 in (0..n).step_by(tile) {
            let t1 = (t0 + tile).min(n);
            let w = &self.weight[(r0 + t0) * self.row_bytes..(r0 + t1) * self.row_bytes];
            let acts = self.acts.chunks_exact(self.act_len).skip(done);
            for (out, a) in outs[done..].iter_mut().zip(acts) {
                // SAFETY: the kernel was selected for an instruction set the
                // CPU supports; `w` holds whole rows and `a` a whole row.
                unsafe { (self.kernel)(w, a, &mut out[t0..t1]) };
            }
        }
    }

    /// [`rows`](Self::rows) for activation rows `a0..a0 + outs.len()` (a
    /// multiple of `k.acts`) with the multi-row kernel `k`: every group of
    /// activation rows runs over a tile of weight rows (which stays in L2)
    /// before the next tile.
    fn multi_rows(&self, k: &MultiKernel<A>, r0: usize, a0: usize, outs: &mut [&mut [f32]]) {
        let n = outs.first().map_or(0, |o| o.len());
        let tile = (MULTI_TILE_BYTES / self.row_bytes.max(1))
            .max(ROW_TILE)
            .min(n.max(1));
        let mut buf = vec![0f32; k.acts * tile];
        let group_len = k.acts * self.act_len;
        let acts = &self.acts[a0 * self.act_len..];
        for t0 in (0..n).step_by(tile) {
            let t1 = (t0 + tile).min(n);
            let w = &self.weight[(r0 + t0) * self.row_bytes..(r0 + t1) * self.row_bytes];
            let buf = &mut buf[..k.acts * (t1 - t0)];
            for (outs, a) in outs
                .chunks_exact_mut(k.acts)
                .zip(acts.chunks_exact(group_len))
            {
                // SAFETY: the kernel was selected for an instruction set the
                // CPU supports; `w` holds whole rows, `a` `k.acts` whole
                // activation rows and `buf` `k.acts` rows of outputs.
                unsafe { (k.kernel)(w, a, self.act_len, buf) };
                for (out, y) in outs.iter_mut().zip(buf.chunks_exact(t1 - t0)) {
                    out[t0..t1].copy_from_slice(y);
                }
            }
        }
    }

    /// [`rows`](Self::rows) for all activation rows with the panel kernels,
    /// `packed` the activations as they laid them out: each tile of weight
    /// rows is decoded once, then multiplied with every activation row.
    fn panel_rows(&self, panel: Panel, packed: &[f32], r0: usize, outs: &mut [&mut [f32]]) {
        // Exact activations are f32 values: a row's `act_len` is its `cols`.
        let cols = self.act_len;
        let n = outs.first().map_or(0, |o| o.len());
        let tile = (panel.tile_bytes / (4 * cols)).clamp(1, n.max(1));
        PANEL_SCRATCH.with_borrow_mut(|decoded| {
            // Grown, never shrunk: fresh pages for every task cost more
            // than the products of a small one.
            let decoded = decoded.floats(tile * cols);
            for t0 in (0..n).step_by(tile) {
                let t1 = (t0 + tile).min(n);
                let w = &self.weight[(r0 + t0) * self.row_bytes..(r0 + t1) * self.row_bytes];
                let decoded = &mut decoded[..(t1 - t0) * cols];
                // SAFETY: the kernels were selected for an instruction set
                // the CPU supports; `w` holds whole rows, `decoded` room for
                // them, `packed` all activation rows and `outs` a row of
                // outputs for each.
                unsafe {
                    (panel.decode)(w, cols, decoded);
                    (panel.multiply)(decoded, packed, cols, outs, t0);
                }
            }
        });
    }

    /// [`rows`](Self::rows) for all activation rows with the int8 panel kernels
    /// (rows of `cols` values): each tile of weight rows is decoded once,
    /// then multiplied with every activation row.
    #[cfg(target_arch = "x86_64")]
    fn int8_rows(&self, amx: Int8Panel<A>, cols: usize, r0: usize, outs: &mut [&mut [f32]]) {
        let n = outs.first().map_or(0, |o| o.len());
        let lanes = super::super::avx512::LANES;
        let tile = ((INT8_TILE_BYTES / cols.max(1)) / lanes * lanes).clamp(lanes, n.max(lanes));
        INT8_SCRATCH.with_borrow_mut(|decoded| {
            for t0 in (0..n).step_by(tile) {
                let t1 = (t0 + tile).min(n);
                let w = &self.weight[(r0 + t0) * self.row_bytes..(r0 + t1) * self.row_bytes];
                // SAFETY: the kernels were selected for an instruction set
                // the CPU supports; `w` holds whole rows, `self.acts` all
                // activation rows (padded to a multiple of 16), `outs` a
                // row of outputs for each.
                unsafe {
                    (amx.decode)(w, cols, decoded);
                    (amx.multiply)(decoded, self.acts, self.act_len, outs, t0, t1 - t0);
                }
            }
        });
    }

    /// Runs the job over all `rows`, writing `y` (`m x rows`), in tasks
    /// over the thread pool.
    pub(super) fn run(&self, rows: usize, y: &mut [f32]) {
        crate::row_tasks::for_each_row_task(y, rows, self.row_bytes, self.row_align, |r0, outs| {
            self.rows(r0, outs)
        });
    }
}
