//! The built-in `kiln-arch-bert` plugin exported from a shared library, so it
//! can be loaded (or replaced by a modified copy) with `--custom-architectures`.

kiln_plugin_api::export_plugin!(root = kiln_arch_bert::kiln_plugin_root);
