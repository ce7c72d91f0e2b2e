//! What a model is run for (vLLM's `--runner`): its architecture's own task,
//! or a text-generation architecture run as an embedding model.

use kiln_plugin_api::graph::GraphIr;
use kiln_plugin_api::Task;

/// `--runner`: which kind of model a checkpoint is run as.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Runner {
    /// The architecture's own task.
    #[default]
    Auto,
    /// Text generation; refused for an encoder.
    Generate,
    /// Pooling: an encoder's own task, and a decoder's final hidden state
    /// of the last token as an embedding (Qwen3-Embedding, gte-Qwen2,
    /// e5-mistral).
    Pooling,
}

/// The causal LM a base model's name stands for: `Qwen3Model` →
/// `Qwen3ForCausalLM`.
pub fn causal_lm_of(name: &str) -> Option<String> {
    name.strip_suffix("Model")
        .filter(|stem| !stem.is_empty())
        .map(|stem| format!("{stem}ForCausalLM"))
}

impl Runner {
    /// `Pooling` where the user chose nothing: what `host embed` and an
    /// embedding reference of `host verify` run a model as.
    pub fn pooling_unless_chosen(self) -> Self {
        match self {
            Runner::Auto => Runner::Pooling,
            chosen => chosen,
        }
    }

    /// `Auto` for a checkpoint whose config names the base model of the
    /// causal LM `registered` (`Qwen3Model` for `Qwen3ForCausalLM`) is
    /// `Pooling`: vLLM runs a `*Model` checkpoint as an embedding model.
    pub fn for_checkpoint(self, hf_config: &serde_json::Value, registered: &str) -> Self {
        let declared = hf_config
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(|a| a.as_str());
        match (self, declared.and_then(causal_lm_of)) {
            (Runner::Auto, Some(causal)) if causal == registered => Runner::Pooling,
            _ => self,
        }
    }

    /// The task a model of architecture `name`, whose own task is `own`,
    /// is run for.
    pub fn task(self, name: &str, own: Task) -> Result<Task, String> {
        match (self, own) {
            (Runner::Pooling, Task::TextGeneration) => Ok(Task::Embeddings),
            (Runner::Generate, Task::Embeddings | Task::SequenceClassification) => Err(format!(
                "`{name}` is a {own} model: it cannot generate text (drop --runner generate)"
            )),
            _ => Ok(own),
        }
    }
}

/// Checks that a graph built for another task than its architecture's
/// gives rows of the config's `hidden_size` (where it names one): a plugin
/// older than plugin-api 1.8 ignores the request's task and gives logits.
pub fn check_hidden_output(graph: &GraphIr, config: &serde_json::Value) -> Result<(), String> {
    let Some(hidden) = config.get("hidden_size").and_then(|v| v.as_u64()) else {
        return Ok(());
    };
    let width = graph
        .outputs
        .first()
        .and_then(|&output| graph.nodes.get(output as usize))
        .and_then(|node| node.ty.shape.last())
        .and_then(|dim| dim.as_static());
    match width {
        Some(width) if width == hidden => Ok(()),
        width => Err(format!(
            "the plugin's graph gives rows of {width:?} values, not the hidden states'              {hidden}: its plugin-api may predate 1.8, which builds decoders as embedding models"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_runs_a_decoder_as_an_embedding_model() {
        let task = |runner: Runner, own| runner.task("X", own);
        assert_eq!(
            task(Runner::Pooling, Task::TextGeneration),
            Ok(Task::Embeddings)
        );
        assert_eq!(
            task(Runner::Pooling, Task::SequenceClassification),
            Ok(Task::SequenceClassification)
        );
        assert_eq!(
            task(Runner::Auto, Task::TextGeneration),
            Ok(Task::TextGeneration)
        );
        assert_eq!(
            task(Runner::Generate, Task::TextGeneration),
            Ok(Task::TextGeneration)
        );
        let refused = task(Runner::Generate, Task::Embeddings).unwrap_err();
        assert!(refused.contains("cannot generate text"), "{refused}");
    }

    #[test]
    fn a_base_models_checkpoint_is_pooled_unless_told_otherwise() {
        let config = |name: &str| serde_json::json!({ "architectures": [name] });
        let qwen3 = "Qwen3ForCausalLM";
        assert_eq!(causal_lm_of("Qwen3Model").as_deref(), Some(qwen3));
        assert_eq!(causal_lm_of("Model"), None);
        let base = config("Qwen3Model");
        assert_eq!(Runner::Auto.for_checkpoint(&base, qwen3), Runner::Pooling);
        assert_eq!(
            Runner::Generate.for_checkpoint(&base, qwen3),
            Runner::Generate
        );
        let causal = config(qwen3);
        assert_eq!(Runner::Auto.for_checkpoint(&causal, qwen3), Runner::Auto);
        // An encoder registered under its own `…Model` name is itself.
        let bert = config("BertModel");
        assert_eq!(
            Runner::Auto.for_checkpoint(&bert, "BertModel"),
            Runner::Auto
        );
    }
}
