//! Where a checkpoint file's tensor bytes are read from: its memory map,
//! or a copy in memory advised for huge pages.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use kiln_kernels::HugePageBuffer;
use memmap2::Mmap;

/// How a checkpoint's tensor bytes are held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorBytes {
    /// In the file's memory map, in 4 KiB pages read as they are touched:
    /// for inspecting a checkpoint, and for devices that copy the weights
    /// away.
    Mapped,
    /// Copied, when a tensor is first read, into memory advised for huge
    /// pages: for the CPU backend, whose decode steps stream every weight
    /// from memory (see `kiln_kernels::HugePageBuffer`). Should the read
    /// fail, or the file not fit in [`COPY_SHARE`] of the available
    /// memory, the map serves.
    HugePages,
}

/// The share of the memory available at open (`MemAvailable`) a file may
/// take as a copy: a larger one stays mapped, so that the OS can still page
/// it.
const COPY_SHARE: f64 = 0.75;

/// The owner of `path`'s tensor bytes, whose memory map is `map`.
pub(crate) fn owner(
    path: &Path,
    map: Arc<Mmap>,
    bytes: TensorBytes,
) -> Arc<dyn AsRef<[u8]> + Send + Sync> {
    let fits = || {
        let available = available_memory();
        let fits = available.is_none_or(|a| map.len() as f64 <= COPY_SHARE * a as f64);
        if !fits {
            tracing::info!(
                "{} ({} MB) stays memory-mapped: too large to copy into the {} MB available",
                path.display(),
                map.len() >> 20,
                available.unwrap_or(0) >> 20
            );
        }
        fits
    };
    match bytes {
        TensorBytes::HugePages if fits() => Arc::new(HugePageCopy {
            path: path.to_owned(),
            map,
            copy: OnceLock::new(),
        }),
        TensorBytes::HugePages | TensorBytes::Mapped => map,
    }
}

/// Bytes of memory available without swapping (Linux's `MemAvailable`), if
/// known.
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib << 10)
}

/// A file's bytes, read on first access into a [`HugePageBuffer`].
struct HugePageCopy {
    path: PathBuf,
    map: Arc<Mmap>,
    copy: OnceLock<Option<HugePageBuffer>>,
}

impl AsRef<[u8]> for HugePageCopy {
    fn as_ref(&self) -> &[u8] {
        match self.copy.get_or_init(|| self.read()) {
            Some(copy) => copy,
            None => &self.map,
        }
    }
}

impl HugePageCopy {
    /// The file, read by the thread pool in chunks; `None` (logged) if it
    /// cannot be read as it was mapped.
    fn read(&self) -> Option<HugePageBuffer> {
        let started = std::time::Instant::now();
        let copy = HugePageBuffer::new(self.map.len()).and_then(|mut copy| {
            read_into(&self.path, &self.map, &mut copy)?;
            Ok(copy)
        });
        match copy {
            Ok(copy) => {
                tracing::debug!(
                    "read {} ({} MB) into huge pages in {:?}",
                    self.path.display(),
                    copy.len() >> 20,
                    started.elapsed()
                );
                Some(copy)
            }
            Err(e) => {
                tracing::warn!(
                    "reading {} into huge pages failed ({e}); its memory map serves instead",
                    self.path.display()
                );
                None
            }
        }
    }
}

/// Reads `path` (whose map is `map`) into `out`, which is as long.
#[cfg(unix)]
fn read_into(path: &Path, _map: &Mmap, out: &mut [u8]) -> std::io::Result<()> {
    use rayon::prelude::*;
    use std::os::unix::fs::FileExt;
    const CHUNK: usize = 16 << 20;
    let file = std::fs::File::open(path)?;
    if file.metadata()?.len() != out.len() as u64 {
        return Err(std::io::Error::other(
            "the file changed size since it was mapped",
        ));
    }
    out.par_chunks_mut(CHUNK)
        .enumerate()
        .try_for_each(|(i, chunk)| file.read_exact_at(chunk, (i * CHUNK) as u64))
}

/// Copies the map into `out` (no positioned reads here).
#[cfg(not(unix))]
fn read_into(_path: &Path, map: &Mmap, out: &mut [u8]) -> std::io::Result<()> {
    out.copy_from_slice(map);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn mapped(path: &Path) -> Arc<Mmap> {
        let file = std::fs::File::open(path).unwrap();
        // SAFETY: a test file nobody else changes while mapped.
        Arc::new(unsafe { Mmap::map(&file) }.unwrap())
    }

    #[test]
    fn a_huge_page_copy_has_the_files_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weights.bin");
        let bytes: Vec<u8> = (0..(40 << 20) + 123).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let map = mapped(&path);
        for how in [TensorBytes::Mapped, TensorBytes::HugePages] {
            let owner = owner(&path, map.clone(), how);
            assert!(owner.as_ref().as_ref() == &bytes[..], "{how:?}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_available_memory_is_read() {
        assert!(available_memory().is_some_and(|bytes| bytes > 0));
    }

    #[test]
    fn a_file_that_grew_since_mapped_is_not_copied_and_its_map_serves() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weights.bin");
        std::fs::write(&path, [1u8, 2, 3]).unwrap();
        let map = mapped(&path);
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        file.write_all(&[4]).unwrap();
        let mut out = [0u8; 3];
        #[cfg(unix)]
        assert!(read_into(&path, &map, &mut out).is_err(), "read {out:?}");
        let owner = owner(&path, map, TensorBytes::HugePages);
        assert_eq!(owner.as_ref().as_ref(), &[1, 2, 3]);
    }
}
