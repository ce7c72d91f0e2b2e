//! `deepseek2` (DeepSeek-V2/V3) metadata as a `DeepseekV3ForCausalLM` config.
//!
//! llama.cpp's converter stores multi-head latent attention as multi-query
//! attention over the latent (`head_count_kv` 1, `key_length`
//! `kv_lora_rank + qk_rope_head_dim`), with the per-head sizes under
//! `key_length_mla` and `value_length_mla`, and `mscale_all_dim` as
//! `rope.scaling.yarn_log_multiplier = 0.1 · mscale_all_dim`.

use serde_json::{json, Map, Value};

use super::super::{GgufError, GgufFile};

impl GgufFile {
    /// The latent attention, mixture-of-experts and YaRN fields of a
    /// `deepseek2` file, over the standard fields already in `config`.
    pub(super) fn deepseek2_fields(
        &self,
        config: &mut Map<String, Value>,
    ) -> Result<(), GgufError> {
        let key = |suffix: &str| format!("deepseek2.{suffix}");
        let required = |suffix: &str| -> Result<u64, GgufError> {
            self.get_u64(&key(suffix))?.ok_or_else(|| {
                GgufError::Unsupported(format!("a deepseek2 file without `{}`", key(suffix)))
            })
        };
        config.insert("hidden_act".into(), json!("silu"));
        // transformers' DeepSeek config: one key/value head per query head
        // (the latent is shared) and `head_dim` the rotated part.
        if let Some(heads) = config.get("num_attention_heads").cloned() {
            config.insert("num_key_value_heads".into(), heads);
        }
        let rope = required("rope.dimension_count")?;
        let rank = required("attention.kv_lora_rank")?;
        // Files from before the MLA keys hold the per-head sizes in
        // key_length and value_length.
        let qk_head = match self.get_u64(&key("attention.key_length_mla"))? {
            Some(n) => n,
            None => required("attention.key_length")?,
        };
        let v_head = match self.get_u64(&key("attention.value_length_mla"))? {
            Some(n) => n,
            None => required("attention.value_length")?,
        };
        let nope = qk_head
            .checked_sub(rope)
            .filter(|&n| n > 0)
            .ok_or_else(|| GgufError::Implausible {
                key: key("attention.key_length_mla"),
                value: qk_head.to_string(),
                reason: format!("must exceed the rotated dimensions ({rope})"),
            })?;
        for (hf, value) in [
            ("head_dim", rope),
            ("qk_rope_head_dim", rope),
            ("qk_nope_head_dim", nope),
            ("v_head_dim", v_head),
            ("kv_lora_rank", rank),
        ] {
            config.insert(hf.into(), json!(value));
        }
        if let Some(rank) = self.get_u64(&key("attention.q_lora_rank"))? {
            config.insert("q_lora_rank".into(), json!(rank));
        }
        config.insert("rope_interleave".into(), json!(true));

        // Expert counts and sizes as the other mixture-of-experts families.
        if !self.moe_fields("deepseek2", config, "n_routed_experts")? {
            return Err(GgufError::Unsupported(format!(
                "a deepseek2 file without `{}`",
                key("expert_count")
            )));
        }
        let groups = self.get_u64(&key("expert_group_count"))?.unwrap_or(1);
        let used_groups = self
            .get_u64(&key("expert_group_used_count"))?
            .unwrap_or(groups);
        let shared = self.get_u64(&key("expert_shared_count"))?.unwrap_or(0);
        let dense = self
            .get_u64(&key("leading_dense_block_count"))?
            .unwrap_or(0);
        for (hf, value) in [
            ("n_shared_experts", shared),
            ("first_k_dense_replace", dense),
            ("n_group", groups),
            ("topk_group", used_groups),
        ] {
            config.insert(hf.into(), json!(value));
        }
        let scale = self
            .config_float(&key("expert_weights_scale"))?
            .unwrap_or(1.0);
        config.insert("routed_scaling_factor".into(), json!(scale));
        let renormalized = self.get_bool(&key("expert_weights_norm"))?.unwrap_or(false);
        config.insert("norm_topk_prob".into(), json!(renormalized));
        // llama.cpp's gating values (1 softmax, 2 sigmoid); files without
        // one are DeepSeek-V2's, which it runs with softmax.
        let scoring = match self.get_u64(&key("expert_gating_func"))? {
            None | Some(1) => "softmax",
            Some(2) => "sigmoid",
            Some(other) => {
                return Err(GgufError::Unsupported(format!(
                    "`{}` = {other} (Kiln knows 1, softmax, and 2, sigmoid)",
                    key("expert_gating_func")
                )))
            }
        };
        config.insert("scoring_func".into(), json!(scoring));
        self.deepseek2_yarn(config)
    }

    /// llama.cpp's DeepSeek YaRN: cos and sin unscaled, and the scores
    /// scaled by `mscale²` with `mscale = 0.1 · mscale_all_dim · ln(factor) + 1`
    /// (transformers' rule when `mscale` equals `mscale_all_dim`).
    fn deepseek2_yarn(&self, config: &mut Map<String, Value>) -> Result<(), GgufError> {
        let Some(Value::Object(scaling)) = config.get_mut("rope_scaling") else {
            return Ok(());
        };
        if scaling.get("rope_type").and_then(Value::as_str) != Some("yarn") {
            return Ok(());
        }
        let attn_factor_key = "deepseek2.rope.scaling.yarn_attn_factor";
        if let Some(factor) = self.config_float(attn_factor_key)?.filter(|&f| f != 1.0) {
            return Err(GgufError::Unsupported(format!(
                "`{attn_factor_key}` = {factor} (only 1)"
            )));
        }
        scaling.insert("attention_factor".into(), json!(1.0));
        if let Some(log_mul) = self.config_float("deepseek2.rope.scaling.yarn_log_multiplier")? {
            let mscale = log_mul / 0.1;
            scaling.insert("mscale".into(), json!(mscale));
            scaling.insert("mscale_all_dim".into(), json!(mscale));
        }
        Ok(())
    }
}
