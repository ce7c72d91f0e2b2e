//! The shared graph compiler: verification, optimization passes, lowering to
//! kernel steps, and the persistent compile cache. Backend-neutral: the CPU
//! runtime executes the [`Program`] it produces.

mod cache;
mod lower;
mod optimize;
mod program;
mod verify;

use std::fmt;

use kiln_plugin_api::graph::GraphIr;

pub use cache::{CompileCache, CompileOutcome};
pub use lower::last_uses;
pub use program::{CompileReport, ElementOp, Instr, Kernel, Operand, Program, Step};

/// Bumped whenever the compiler's output for a given graph may change; part of
/// the compile-cache key.
pub const COMPILER_VERSION: u32 = 1;

/// A graph the compiler rejects, naming the op and the module that made it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct CompileError {
    /// The op, e.g. `matmul`.
    pub op: String,
    /// The module path recorded by the plugin.
    pub module: String,
    /// What is wrong.
    pub message: String,
}

impl CompileError {
    fn at(ir: &GraphIr, id: usize, message: String) -> Self {
        let node = &ir.nodes[id];
        Self {
            op: format!("%{id} = {}", node.op.name()),
            module: node.module.clone(),
            message,
        }
    }
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid graph: `{}`", self.op)?;
        if !self.module.is_empty() {
            write!(f, " in module `{}`", self.module)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Compiles a graph: verify, remove dead code, merge common subexpressions,
/// fold constants, lower to kernels (weight matmuls, fused element-wise
/// chains) and plan value lifetimes.
pub fn compile(ir: &GraphIr) -> Result<Program, CompileError> {
    verify::verify(ir)?;
    let mut report = CompileReport {
        nodes_in: ir.nodes.len(),
        ..CompileReport::default()
    };
    let (graph, dead) = optimize::eliminate_dead_code(ir);
    let (graph, merged) = optimize::eliminate_common_subexpressions(&graph);
    let (graph, folded) = optimize::fold_constants(&graph).map_err(|message| CompileError {
        op: "constant folding".into(),
        module: String::new(),
        message,
    })?;
    let (graph, dead_after_folding) = optimize::eliminate_dead_code(&graph);
    report.dead_removed = dead + dead_after_folding;
    report.cse_merged = merged;
    report.folded = folded;
    let (steps, last_use) = lower::lower(&graph, &mut report);
    Ok(Program {
        graph,
        steps,
        last_use,
        report,
    })
}
