//! The architectures available in this run: built-ins, overridden or extended
//! by `--custom-architectures` plugins.

use std::collections::HashMap;
use std::path::PathBuf;

use super::{
    load_builtin_plugins, load_plugin_file, plugin_files, Architecture, LoadedPlugin,
    PluginLoadError, PluginSource,
};

/// Why the registry could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// A plugin failed to load.
    #[error(transparent)]
    Load(#[from] PluginLoadError),

    /// Two plugins of the same kind (two custom ones, or two built-ins)
    /// register the same name.
    #[error("architecture name `{name}` is registered twice: by {first} and by {second}\n  hint: load only one of these plugins")]
    DuplicateName {
        /// The contested name.
        name: String,
        /// The first registration's source.
        first: String,
        /// The second registration's source.
        second: String,
    },
}

/// Every architecture of this run, looked up by name or alias.
#[derive(Debug, Default)]
pub struct ArchitectureRegistry {
    architectures: Vec<Architecture>,
    by_name: HashMap<String, usize>,
}

impl ArchitectureRegistry {
    /// Loads the built-in plugins and the plugins at `custom_paths` (files or
    /// directories of them).
    pub fn load(custom_paths: &[PathBuf]) -> Result<Self, RegistryError> {
        let builtins = load_builtin_plugins()?;
        let custom = plugin_files(custom_paths)?
            .iter()
            .map(|path| load_plugin_file(path))
            .collect::<Result<Vec<_>, _>>()?;
        Self::from_plugins(builtins, custom)
    }

    /// Builds the registry. A custom architecture that shares a name or alias
    /// with a built-in one replaces that built-in architecture, with a warning;
    /// any other name registered twice is an error.
    pub fn from_plugins(
        builtins: Vec<LoadedPlugin>,
        custom: Vec<LoadedPlugin>,
    ) -> Result<Self, RegistryError> {
        let mut registry = Self::default();
        let tagged = builtins
            .into_iter()
            .map(|plugin| (plugin, false))
            .chain(custom.into_iter().map(|plugin| (plugin, true)));
        for (plugin, custom) in tagged {
            for arch in plugin.architectures {
                registry.insert(arch, custom)?;
            }
        }
        Ok(registry)
    }

    fn insert(&mut self, arch: Architecture, custom: bool) -> Result<(), RegistryError> {
        let mut replaced = Vec::new();
        for name in arch.info.names() {
            let Some(&index) = self.by_name.get(name) else {
                continue;
            };
            let owner = &self.architectures[index];
            if !(custom && owner.plugin.source == PluginSource::BuiltIn) {
                return Err(RegistryError::DuplicateName {
                    name: name.to_owned(),
                    first: describe(owner),
                    second: describe(&arch),
                });
            }
            if !replaced.contains(&index) {
                tracing::warn!(
                    "custom architecture `{}` from {} overrides the built-in `{}` of plugin `{}`",
                    arch.info.name,
                    arch.plugin.source,
                    owner.info.name,
                    owner.plugin.name
                );
                replaced.push(index);
            }
        }
        replaced.sort_unstable();
        for index in replaced.into_iter().rev() {
            self.architectures.remove(index);
        }
        self.architectures.push(arch);
        self.by_name = self
            .architectures
            .iter()
            .enumerate()
            .flat_map(|(index, arch)| arch.info.names().map(move |name| (name.to_owned(), index)))
            .collect();
        Ok(())
    }

    /// The architecture with this name or alias.
    pub fn get(&self, name: &str) -> Option<&Architecture> {
        self.by_name
            .get(name)
            .map(|&index| &self.architectures[index])
    }

    /// All architectures: built-ins first, then custom ones, each in load order.
    pub fn architectures(&self) -> &[Architecture] {
        &self.architectures
    }
}

fn describe(arch: &Architecture) -> String {
    format!("plugin `{}` ({})", arch.plugin.name, arch.plugin.source)
}

#[cfg(test)]
mod tests {
    use super::super::loader::load_root;
    use super::*;
    use kiln_plugin_api::{Plugin, SupportedArchitecture, Task};

    mod alpha {
        fn plugin() -> kiln_plugin_api::Plugin {
            super::single("alpha", "AlphaForCausalLM", "shared")
        }
        kiln_plugin_api::declare_plugin!(plugin);
    }

    mod beta {
        fn plugin() -> kiln_plugin_api::Plugin {
            super::single("beta", "BetaForCausalLM", "shared")
        }
        kiln_plugin_api::declare_plugin!(plugin);
    }

    fn single(plugin: &str, arch: &str, alias: &str) -> Plugin {
        Plugin::new(plugin, "1.0.0").with_architecture(
            SupportedArchitecture::new(arch, Task::TextGeneration).with_aliases([alias]),
        )
    }

    #[test]
    fn builtins_sharing_a_name_are_an_error() {
        let load = |root| load_root(root, PluginSource::BuiltIn).unwrap();
        let plugins = vec![
            load(alpha::kiln_plugin_root()),
            load(beta::kiln_plugin_root()),
        ];
        let error = ArchitectureRegistry::from_plugins(plugins, Vec::new()).unwrap_err();
        assert_eq!(
            error.to_string().lines().next().unwrap(),
            "architecture name `shared` is registered twice: by plugin `alpha` (built-in) and by plugin `beta` (built-in)"
        );
    }

    #[test]
    fn the_real_builtins_register_distinct_names() {
        let registry =
            ArchitectureRegistry::from_plugins(load_builtin_plugins().unwrap(), Vec::new())
                .unwrap();
        assert!(registry.get("LlamaForCausalLM").is_some());
        assert!(registry.get("mistral").is_some());
    }
}
