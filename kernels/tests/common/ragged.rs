//! A ragged attention batch over a paged KV cache, as the attention tests
//! build it: sequences with a history already in the cache and rows fed this
//! step, blocks handed out in a shuffled order, and a spare all-NaN block that
//! pads the device's block tables (reading past a table shows up).

use std::ops::Range;

use kiln_kernels::cuda::KernelArg::{self, Ptr};
use kiln_kernels::dense::attention::{self as attn, CacheLayout, SequenceRows};

use super::{int, Gpu, Rng};

pub struct RaggedBatch {
    pub layout: CacheLayout,
    /// (context length after the step, rows fed) per sequence.
    pub shapes: Vec<(usize, usize)>,
    pub tables: Vec<Vec<usize>>,
    /// Host caches [blocks, block_size, kv_heads, head_dim] holding every
    /// sequence's history (the positions before this step's rows).
    pub k_cache: Vec<f32>,
    pub v_cache: Vec<f32>,
    /// Rows fed this step, over all sequences.
    pub rows: usize,
    /// Block-table width of the device's tables.
    pub per_seq: usize,
    row_offsets: Vec<i64>,
    context_lens: Vec<i64>,
    table_ids: Vec<i64>,
}

impl RaggedBatch {
    pub fn new(rng: &mut Rng, layout: CacheLayout, shapes: &[(usize, usize)]) -> Self {
        let bs = layout.block_size;
        let stride = layout.num_kv_heads * layout.head_dim;
        let blocks = 2 + shapes.iter().map(|(c, _)| c.div_ceil(bs)).sum::<usize>();
        let mut order: Vec<usize> = (0..blocks).collect();
        for i in (1..blocks).rev() {
            order.swap(i, rng.u32() as usize % (i + 1));
        }
        let pad = order.pop().unwrap();
        let mut table = |c: usize| (0..c.div_ceil(bs)).map(|_| order.pop().unwrap()).collect();
        let tables: Vec<Vec<usize>> = shapes.iter().map(|&(c, _)| table(c)).collect();
        let per_seq = tables.iter().map(Vec::len).max().unwrap();
        let mut k_cache = vec![0f32; blocks * bs * stride];
        k_cache[pad * bs * stride..(pad + 1) * bs * stride].fill(f32::NAN);
        let mut v_cache = k_cache.clone();
        let (mut row_offsets, mut context_lens, mut table_ids) = (vec![0i64], vec![], vec![]);
        let mut rows = 0;
        for (&(context, fed), table) in shapes.iter().zip(&tables) {
            let before = context - fed;
            let k = rng.data(before * stride, 1.0);
            let v = rng.data(before * stride, 1.0);
            let history = [seq(0..before, before, table)];
            attn::write_kv(layout, &mut k_cache, &mut v_cache, &k, &v, &history);
            rows += fed;
            row_offsets.push(rows as i64);
            context_lens.push(context as i64);
            table_ids.extend((0..per_seq).map(|i| *table.get(i).unwrap_or(&pad) as i64));
        }
        RaggedBatch {
            layout,
            shapes: shapes.to_vec(),
            tables,
            k_cache,
            v_cache,
            rows,
            per_seq,
            row_offsets,
            context_lens,
            table_ids,
        }
    }

    /// The CPU kernels' view of this step's rows.
    pub fn sequences(&self) -> Vec<SequenceRows<'_>> {
        let mut first = 0;
        let shapes = self.shapes.iter().zip(&self.tables);
        let per = shapes.map(|(&(context, fed), table)| {
            first += fed;
            seq(first - fed..first, context, table)
        });
        per.collect()
    }

    /// The batch arguments every attention kernel takes: row offsets,
    /// context lengths, block tables (uploaded), batch size, table width and
    /// block size.
    pub fn metadata(&self, gpu: &Gpu) -> Vec<KernelArg> {
        vec![
            Ptr(gpu.up(&self.row_offsets)),
            Ptr(gpu.up(&self.context_lens)),
            Ptr(gpu.up(&self.table_ids)),
            int(self.shapes.len()),
            int(self.per_seq),
            int(self.layout.block_size),
        ]
    }
}

pub fn seq(rows: Range<usize>, context_len: usize, block_table: &[usize]) -> SequenceRows<'_> {
    SequenceRows {
        rows,
        context_len,
        block_table,
    }
}
