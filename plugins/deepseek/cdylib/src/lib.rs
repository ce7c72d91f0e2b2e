//! The built-in `kiln-arch-deepseek` plugin exported from a shared library,
//! so it can be loaded (or replaced by a modified copy) with
//! `--custom-architectures`.

kiln_plugin_api::export_plugin!(root = kiln_arch_deepseek::kiln_plugin_root);
