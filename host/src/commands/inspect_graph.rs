//! `host inspect-graph`: the graph an architecture builds, and what the
//! compiler makes of it.

use std::fmt::Write as _;

use anyhow::Context;
use kiln_plugin_api::graph::{Device, GraphIr};
use kiln_plugin_api::{ConfigRequest, GraphRequest};

use crate::cli::InspectGraphArgs;
use crate::compiler::{CompileCache, CompileOutcome, Kernel, Program};
use crate::plugins::ArchitectureRegistry;

/// Prints the graph (and with `--compiled`, the compiled program).
pub fn inspect_graph(args: &InspectGraphArgs) -> anyhow::Result<()> {
    let registry = ArchitectureRegistry::load(&args.plugins.custom_architectures)?;
    let arch = registry.get(&args.architecture).with_context(|| {
        let known: Vec<&str> = registry
            .architectures()
            .iter()
            .map(|a| a.info.name.as_str())
            .collect();
        format!(
            "unknown architecture `{}` (registered: {})",
            args.architecture,
            known.join(", ")
        )
    })?;
    let text = std::fs::read_to_string(&args.config)
        .with_context(|| format!("cannot read {}", args.config.display()))?;
    let hf_config = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", args.config.display()))?;
    let config = arch.config(&ConfigRequest {
        hf_config,
        max_length: args.max_length,
    })?;
    let graph = arch.build_graph(&GraphRequest {
        config,
        weights_format: None,
        state_dict: None,
        task: None,
    })?;
    let mut out = format!("{graph}\n");
    if args.compiled {
        let cache = if args.no_compile_cache {
            CompileCache::disabled()
        } else {
            CompileCache::from_env()
        };
        let (program, outcome) = cache.get_or_compile(&graph, Device::Cpu)?;
        out.push_str(&describe(&program, outcome));
    }
    super::write_stdout(&out)
}

/// The compiled program: pass statistics, timing, and one line per step.
fn describe(program: &Program, outcome: CompileOutcome) -> String {
    let graph: &GraphIr = &program.graph;
    let r = &program.report;
    let mut out = String::new();
    let (how, time) = match outcome {
        CompileOutcome::Compiled(t) => ("compiled", t),
        CompileOutcome::Cached(t) => ("loaded from the compile cache", t),
    };
    let _ = writeln!(
        out,
        "\nprogram ({how} in {:.1} ms):",
        time.as_secs_f64() * 1e3
    );
    let _ = writeln!(
        out,
        "  {} nodes in; {} dead removed, {} merged, {} folded; {} weight matmuls lowered; {} ops fused into {} kernels; {} steps",
        r.nodes_in, r.dead_removed, r.cse_merged, r.folded, r.lowered, r.fused_ops, r.fused_kernels, r.steps
    );
    for (i, step) in program.steps.iter().enumerate() {
        let node = &graph.nodes[step.output as usize];
        let kernel = match &step.kernel {
            Kernel::Node => node.op.name(),
            Kernel::Linear { weight } => format!(
                "linear[{} {}]",
                graph.weights[*weight].name, graph.weights[*weight].encoding
            ),
            Kernel::Embedding { weight } => format!("embedding[{}]", graph.weights[*weight].name),
            Kernel::MixtureOfExperts { gate, .. } => format!("mixture_of_experts[{}]", gate.len()),
            Kernel::Fused { program } => format!("fused[{} ops]", program.len()),
        };
        let args: Vec<String> = step.inputs.iter().map(|v| format!("%{v}")).collect();
        let _ = writeln!(
            out,
            "  step {i}: %{} = {kernel}({}) : {}",
            step.output,
            args.join(", "),
            node.ty
        );
    }
    out
}
