//! A product's weight rows split into tasks over the thread pool, each task
//! writing its own columns of every output row. The quantized and the
//! f16/bf16 products share it.

use rayon::prelude::*;

/// Tasks per thread, for balance.
const TASKS_PER_THREAD: usize = 4;
/// The least work (weight bytes times activation rows) worth a task.
const MIN_TASK_WORK: usize = 32 * 1024;
/// The least work worth handing to the thread pool from a thread outside it:
/// waking a pool thread and being woken again costs tens of microseconds on
/// some machines (about 40 µs on a 2-vCPU VM), so smaller products run on the
/// calling thread. Inside the pool, splitting costs about a microsecond.
const MIN_WORK_FROM_OUTSIDE: usize = 2 << 20;

/// Runs `task(first_row, outs)` over `rows` weight rows of `row_bytes`
/// bytes each, writing `y` (`m × rows`): a task gets a run of weight rows
/// from `first_row` on (a multiple of `row_align` rows, but for the last
/// task's) and `outs[i]`, its columns of output row `i`.
pub(crate) fn for_each_row_task(
    y: &mut [f32],
    rows: usize,
    row_bytes: usize,
    row_align: usize,
    task: impl Fn(usize, &mut [&mut [f32]]) + Sync,
) {
    if rows == 0 || y.is_empty() {
        return;
    }
    let m = y.len() / rows;
    let outside = rayon::current_thread_index().is_none();
    let threads = rayon::current_num_threads();
    let chunk = rows_per_task(rows, (row_bytes * m).max(1), row_align, threads, outside);
    if chunk == rows {
        let mut outs: Vec<&mut [f32]> = y.chunks_exact_mut(rows).collect();
        task(0, &mut outs);
    } else if m == 1 {
        y.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(c, out)| task(c * chunk, &mut [out]));
    } else {
        // Task c gets columns c*chunk.. of every output row.
        let mut tasks: Vec<Vec<&mut [f32]>> = (0..rows.div_ceil(chunk))
            .map(|_| Vec::with_capacity(m))
            .collect();
        for out in y.chunks_exact_mut(rows) {
            for (task, part) in tasks.iter_mut().zip(out.chunks_mut(chunk)) {
                task.push(part);
            }
        }
        tasks
            .into_par_iter()
            .enumerate()
            .for_each(|(c, mut outs)| task(c * chunk, &mut outs));
    }
}

/// Weight rows per task: [`TASKS_PER_THREAD`] tasks a thread, a multiple of
/// `row_align`, at least [`MIN_TASK_WORK`]; all of them on the calling
/// thread when it is outside the pool and the product is small.
fn rows_per_task(
    rows: usize,
    work_per_row: usize,
    row_align: usize,
    threads: usize,
    outside: bool,
) -> usize {
    if outside && work_per_row.saturating_mul(rows) < MIN_WORK_FROM_OUTSIDE {
        return rows;
    }
    rows.div_ceil(threads * TASKS_PER_THREAD)
        .max(MIN_TASK_WORK.div_ceil(work_per_row))
        .next_multiple_of(row_align)
        .min(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_are_a_few_a_thread_and_small_products_stay_on_the_caller() {
        // SmolLM2's bf16 attention projection in decode: 8 tasks on 2 threads.
        assert_eq!(rows_per_task(576, 1152, 4, 2, false), 72);
        assert_eq!(rows_per_task(576, 1152, 4, 2, true), 576);
        // Its bf16 LM head from outside the pool is worth the pool.
        assert_eq!(rows_per_task(49152, 1152, 4, 2, true), 6144);
        // A task does at least MIN_TASK_WORK.
        assert_eq!(rows_per_task(64, 32, 4, 8, false), 64);
    }

    #[test]
    fn every_output_is_written_once_by_the_task_of_its_column() {
        for (m, rows, row_bytes) in [(1, 5000, 1024), (3, 5000, 1024), (2, 7, 16)] {
            let mut y = vec![0f32; m * rows];
            rayon::ThreadPoolBuilder::new()
                .num_threads(2)
                .build()
                .unwrap()
                .install(|| {
                    for_each_row_task(&mut y, rows, row_bytes, 4, |first, outs| {
                        for (i, out) in outs.iter_mut().enumerate() {
                            for (r, value) in out.iter_mut().enumerate() {
                                *value += (i * rows + first + r) as f32;
                            }
                        }
                    })
                });
            let expected: Vec<f32> = (0..m * rows).map(|v| v as f32).collect();
            assert_eq!(y, expected, "{m} x {rows}");
        }
    }
}
