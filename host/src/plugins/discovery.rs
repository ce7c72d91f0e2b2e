//! Turning `--custom-architectures` paths into plugin files.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::PluginLoadError;

/// Expands each path (a shared library, or a directory whose shared libraries
/// are all taken, in name order) into plugin files. A file named twice, directly
/// or through a directory, is taken once.
pub fn plugin_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, PluginLoadError> {
    let mut files = Vec::new();
    let mut seen = HashSet::new();
    for path in paths {
        for file in expand(path)? {
            let key = file.canonicalize().unwrap_or_else(|_| file.clone());
            if seen.insert(key) {
                files.push(file);
            }
        }
    }
    Ok(files)
}

fn expand(path: &Path) -> Result<Vec<PathBuf>, PluginLoadError> {
    let unreadable = |source| PluginLoadError::Unreadable {
        path: path.to_owned(),
        source,
    };
    let metadata = match path.metadata() {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(PluginLoadError::NotFound(
                path.to_owned(),
                super::error::rust_library_hint(path),
            ))
        }
        Err(e) => return Err(unreadable(e)),
    };
    if !metadata.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(unreadable)? {
        let file = entry.map_err(unreadable)?.path();
        let is_library =
            file.extension().and_then(|e| e.to_str()) == Some(std::env::consts::DLL_EXTENSION);
        if is_library && file.is_file() {
            files.push(file);
        }
    }
    if files.is_empty() {
        return Err(PluginLoadError::EmptyDirectory(path.to_owned()));
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_directories_and_dedupes() {
        let dir = tempfile::tempdir().unwrap();
        let ext = std::env::consts::DLL_EXTENSION;
        let b = dir.path().join(format!("libb.{ext}"));
        let a = dir.path().join(format!("liba.{ext}"));
        for file in [&a, &b] {
            std::fs::write(file, b"").unwrap();
        }
        std::fs::write(dir.path().join("notes.txt"), b"").unwrap();

        let files = plugin_files(&[b.clone(), dir.path().to_owned()]).unwrap();
        assert_eq!(files, vec![b, a]);
    }

    #[test]
    fn reports_missing_paths_and_empty_directories() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.so");
        let err = plugin_files(&[missing]).unwrap_err().to_string();
        assert!(err.ends_with("nope.so does not exist"), "{err}");
        let err = plugin_files(&[dir.path().to_owned()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("contains no ."), "{err}");
    }
}
