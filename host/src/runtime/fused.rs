//! Execution of fused element-wise programs: one pass over the output in
//! chunks, each instruction a tight loop over a chunk-sized register.

use std::ops::Range;

use kiln_plugin_api::graph::{BinaryOp, DType};
use rayon::prelude::*;

use super::broadcast::{combine, Broadcast, CHUNK};
use super::cpu_ops::{cast, compare_f32, unary, unary_f32_in_place};
use super::pool::BufferPool;
use super::tensor::{round_floats, storage_of, Data, Storage, Tensor};
use crate::compiler::{ElementOp, Instr, Operand};

/// A chunk of values.
#[derive(Clone)]
enum Reg {
    F(Vec<f32>),
    I(Vec<i64>),
    B(Vec<bool>),
}

/// Runs `program` over `inputs` (broadcast to `shape`) producing `dtype`; a
/// float output takes its buffer from `pool`, and its chunks are written in
/// place by the threads that compute them.
pub fn run(
    program: &[Instr],
    inputs: &[&Tensor],
    dtype: DType,
    shape: Vec<usize>,
    pool: &BufferPool,
) -> Result<Tensor, String> {
    let total: usize = shape.iter().product();
    let patterns: Vec<Broadcast> = inputs
        .iter()
        .map(|t| Broadcast::of(&t.shape, &shape))
        .collect();
    let chunk = |c: usize| {
        let range = c * CHUNK..((c + 1) * CHUNK).min(total);
        run_chunk(program, inputs, &patterns, range)
    };
    let data = match storage_of(dtype) {
        Storage::F32 => {
            let mut out = pool.take_for_overwrite(total);
            out.par_chunks_mut(CHUNK)
                .enumerate()
                .try_for_each(|(c, out)| match chunk(c)? {
                    Reg::F(v) => {
                        out.copy_from_slice(&v);
                        Ok(())
                    }
                    _ => Err(WRONG_TYPE.to_owned()),
                })?;
            Data::F32(out)
        }
        storage => {
            let chunks: Vec<Result<Reg, String>> = (0..total.div_ceil(CHUNK))
                .into_par_iter()
                .map(chunk)
                .collect();
            let mut data = match storage {
                Storage::I64 => Data::I64(Vec::with_capacity(total)),
                _ => Data::Bool(Vec::with_capacity(total)),
            };
            for chunk in chunks {
                match (&mut data, chunk?) {
                    (Data::I64(out), Reg::I(v)) => out.extend(v),
                    (Data::Bool(out), Reg::B(v)) => out.extend(v),
                    _ => return Err(WRONG_TYPE.to_owned()),
                }
            }
            data
        }
    };
    Ok(Tensor { dtype, shape, data })
}

/// A chunk whose storage type is not the output's.
const WRONG_TYPE: &str = "fused program produced the wrong type";

/// The program's result for the output elements `range`.
fn run_chunk(
    program: &[Instr],
    inputs: &[&Tensor],
    patterns: &[Broadcast],
    range: Range<usize>,
) -> Result<Reg, String> {
    let mut regs: Vec<Reg> = Vec::with_capacity(program.len());
    for instr in program {
        let arg = |operand: &Operand| -> Reg {
            match *operand {
                Operand::Reg(r) => regs[r].clone(),
                Operand::Input(i) => load(inputs[i], &patterns[i], range.clone()),
            }
        };
        let args: Vec<Reg> = instr.args.iter().map(arg).collect();
        regs.push(apply(instr, args)?);
    }
    Ok(regs.pop().expect("programs are not empty"))
}

fn load(t: &Tensor, pattern: &Broadcast, range: Range<usize>) -> Reg {
    fn pick<T: Copy + Default>(v: &[T], pattern: &Broadcast, range: Range<usize>) -> Vec<T> {
        let mut out = vec![T::default(); range.len()];
        pattern.gather(v, range.start, &mut out);
        out
    }
    match &t.data {
        Data::F32(v) => Reg::F(pick(v, pattern, range)),
        Data::I64(v) => Reg::I(pick(v, pattern, range)),
        Data::Bool(v) => Reg::B(pick(v, pattern, range)),
    }
}

fn to_tensor(reg: Reg, dtype: DType) -> Tensor {
    let len = match &reg {
        Reg::F(v) => v.len(),
        Reg::I(v) => v.len(),
        Reg::B(v) => v.len(),
    };
    let data = match reg {
        Reg::F(v) => Data::F32(v),
        Reg::I(v) => Data::I64(v),
        Reg::B(v) => Data::Bool(v),
    };
    Tensor {
        dtype,
        shape: vec![len],
        data,
    }
}

fn from_tensor(t: Tensor) -> Reg {
    match t.data {
        Data::F32(v) => Reg::F(v),
        Data::I64(v) => Reg::I(v),
        Data::Bool(v) => Reg::B(v),
    }
}

fn apply(instr: &Instr, mut args: Vec<Reg>) -> Result<Reg, String> {
    Ok(match (instr.op, args.as_mut_slice()) {
        (ElementOp::Unary { f }, [Reg::F(x)]) => {
            unary_f32_in_place(f, x);
            round_floats(instr.dtype, x);
            Reg::F(std::mem::take(x))
        }
        (ElementOp::Binary { f }, [Reg::F(a), Reg::F(b)]) if !f.is_predicate() => {
            combine(f, a, b);
            round_floats(instr.dtype, a);
            Reg::F(std::mem::take(a))
        }
        (ElementOp::Binary { f }, [Reg::F(a), Reg::F(b)])
            if !matches!(f, BinaryOp::And | BinaryOp::Or) =>
        {
            let g = compare_f32(f);
            Reg::B(a.iter().zip(b.iter()).map(|(x, y)| g(*x, *y)).collect())
        }
        (ElementOp::Where, [Reg::B(c), Reg::F(a), Reg::F(b)]) => Reg::F(
            c.iter()
                .zip(a.iter().zip(b.iter()))
                .map(|(&c, (&x, &y))| if c { x } else { y })
                .collect(),
        ),
        (ElementOp::Cast, [x]) => {
            from_tensor(cast(&to_tensor(x.clone(), reg_dtype(x)), instr.dtype))
        }
        // Integer and boolean chains are rare; evaluate them through the
        // unfused kernels on chunk-sized tensors.
        (op, args) => {
            let tensors: Vec<Tensor> = args
                .iter()
                .map(|r| to_tensor(r.clone(), reg_dtype(r)))
                .collect();
            let refs: Vec<&Tensor> = tensors.iter().collect();
            let len = tensors[0].len();
            let out = match op {
                ElementOp::Unary { f } => unary(f, refs[0]),
                ElementOp::Binary { f } => super::cpu_ops::eval(
                    &kiln_plugin_api::graph::Op::Binary { op: f },
                    &refs,
                    instr.dtype,
                    vec![len],
                    &BufferPool::default(),
                )?,
                ElementOp::Where => super::cpu_ops::eval(
                    &kiln_plugin_api::graph::Op::Where,
                    &refs,
                    instr.dtype,
                    vec![len],
                    &BufferPool::default(),
                )?,
                ElementOp::Cast => cast(refs[0], instr.dtype),
            };
            from_tensor(out)
        }
    })
}

fn reg_dtype(reg: &Reg) -> DType {
    match reg {
        Reg::F(_) => DType::F32,
        Reg::I(_) => DType::I64,
        Reg::B(_) => DType::Bool,
    }
}
