//! The plugins linked into the host: the built-in architectures, written
//! against `kiln-plugin-api` like any third-party plugin.

use kiln_plugin_api::abi::PluginRootRef;

/// The root modules of every built-in plugin.
pub(super) fn roots() -> Vec<PluginRootRef> {
    vec![
        kiln_arch_llama::kiln_plugin_root(),
        kiln_arch_qwen::kiln_plugin_root(),
        kiln_arch_gemma::kiln_plugin_root(),
        kiln_arch_phi3::kiln_plugin_root(),
        kiln_arch_gpt2::kiln_plugin_root(),
        kiln_arch_bert::kiln_plugin_root(),
        kiln_arch_deepseek::kiln_plugin_root(),
    ]
}
