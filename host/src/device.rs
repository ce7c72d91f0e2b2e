//! Choosing where a model runs: `--device cpu`, `cuda`/`cuda:N` (`gpu` and
//! `gpu:N` are aliases) or `cuda-emulated`. CUDA devices are opened through
//! the driver, NVRTC and cuBLAS, all loaded at run time (cudarc's dynamic
//! loading), so this binary builds and runs on machines without CUDA;
//! `cuda-emulated` runs the CUDA backend's kernels on the CPU through the
//! kernel emulator (slow: a test device); `cuda-null` runs the CUDA backend
//! over a device that runs nothing, which measures the host's share of a
//! step (`host benchmark` only).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use kiln_kernels::cuda::driver::{self, CudaDevice};
use kiln_kernels::cuda::emulator::Emulator;
use kiln_kernels::cuda::null::NullDevice;
use kiln_kernels::cuda::Device;

/// Memory the emulated device reports (`KILN_EMULATOR_MEMORY`, bytes).
const EMULATOR_MEMORY: usize = 4 << 30;

/// Memory the null device reports: an H100's 80 GB, so any shape that fits
/// one loads and its KV cache is sized as there.
const NULL_DEVICE_MEMORY: usize = 80 << 30;

/// A device named on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The CPU backend.
    Cpu,
    /// The CUDA backend on GPU N (`cuda`, `gpu` are `cuda:0`).
    Cuda(usize),
    /// The CUDA backend on the kernel emulator.
    CudaEmulated,
    /// The CUDA backend on a device that runs nothing: the host's share of
    /// a step, timed alone (`host benchmark`).
    CudaNull,
}

impl DeviceChoice {
    /// Whether the model runs on the CUDA backend (on any device).
    pub fn is_cuda(self) -> bool {
        !matches!(self, DeviceChoice::Cpu)
    }
}

impl FromStr for DeviceChoice {
    type Err = DeviceError;

    fn from_str(text: &str) -> Result<Self, DeviceError> {
        match text {
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" | "gpu" => Ok(DeviceChoice::Cuda(0)),
            "cuda-emulated" => Ok(DeviceChoice::CudaEmulated),
            "cuda-null" => Ok(DeviceChoice::CudaNull),
            _ => text
                .strip_prefix("cuda:")
                .or_else(|| text.strip_prefix("gpu:"))
                .and_then(|n| n.parse().ok())
                .map(DeviceChoice::Cuda)
                .ok_or_else(|| DeviceError::Unknown(text.to_owned())),
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceChoice::Cpu => f.write_str("cpu"),
            DeviceChoice::Cuda(n) => write!(f, "cuda:{n}"),
            DeviceChoice::CudaEmulated => f.write_str("cuda-emulated"),
            DeviceChoice::CudaNull => f.write_str("cuda-null"),
        }
    }
}

/// Why a device cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// Not a known device.
    #[error("--device {0}: expected cpu, cuda, cuda:N, cuda-emulated or cuda-null")]
    Unknown(String),
    /// A CUDA library is not installed.
    #[error("--device {0}: {1} could not be loaded; use --device cpu")]
    Missing(DeviceChoice, &'static str),
    /// The driver failed to start or to count devices.
    #[error("--device {device}: the CUDA driver failed: {message}")]
    Driver {
        /// The device asked for.
        device: DeviceChoice,
        /// The driver's error.
        message: String,
    },
    /// `KILN_GEMM_ALGORITHM` has a value other than `timed` or `heuristic`.
    #[error("KILN_GEMM_ALGORITHM={0}: expected timed (cuBLASLt's algorithms timed at first use, the default) or heuristic (cuBLAS's own pick)")]
    GemmAlgorithm(String),
    /// Fewer GPUs than the index asked for.
    #[error("--device {device}: this machine has {count} CUDA device(s)")]
    NoSuchGpu {
        /// The device asked for.
        device: DeviceChoice,
        /// GPUs present.
        count: usize,
    },
}

/// Whether a GPU's products of decode's and prefill chunks' row counts run
/// in the cuBLASLt
/// algorithm timed fastest at their first use (`KILN_GEMM_ALGORITHM=timed`,
/// the default) or in the one cuBLAS's heuristics pick (`heuristic`), as a
/// benchmark compares them.
fn time_gemm_algorithms() -> Result<bool, DeviceError> {
    parse_gemm_algorithm(std::env::var("KILN_GEMM_ALGORITHM").ok().as_deref())
}

/// [`time_gemm_algorithms`] of `KILN_GEMM_ALGORITHM`'s value, if set.
fn parse_gemm_algorithm(value: Option<&str>) -> Result<bool, DeviceError> {
    match value {
        None | Some("timed") => Ok(true),
        Some("heuristic") => Ok(false),
        Some(other) => Err(DeviceError::GemmAlgorithm(other.to_owned())),
    }
}

/// Checks without opening it that the device's libraries load (the CUDA
/// driver, NVRTC, cuBLAS), so a command can fail before reading large files.
pub fn probe(device: DeviceChoice) -> Result<(), DeviceError> {
    match (device, driver::missing_library()) {
        (DeviceChoice::Cuda(_), Some(missing)) => Err(DeviceError::Missing(device, missing)),
        _ => Ok(()),
    }
}

/// Opens the device: `None` for the CPU, else the CUDA device (real,
/// emulated or null; the emulator caches compiled kernels under
/// `kernel_cache`).
/// Every failure is one line naming what is missing.
pub fn open(
    device: DeviceChoice,
    kernel_cache: PathBuf,
) -> Result<Option<Arc<dyn Device>>, DeviceError> {
    match device {
        DeviceChoice::Cpu => Ok(None),
        DeviceChoice::CudaEmulated => {
            let memory = std::env::var("KILN_EMULATOR_MEMORY")
                .ok()
                .and_then(|m| m.parse().ok())
                .unwrap_or(EMULATOR_MEMORY);
            Ok(Some(Arc::new(Emulator::new(
                memory,
                kernel_cache.join("emulator"),
            ))))
        }
        DeviceChoice::CudaNull => Ok(Some(Arc::new(NullDevice::new(NULL_DEVICE_MEMORY)))),
        DeviceChoice::Cuda(index) => {
            // cudarc panics on first use of a missing library: probe first.
            if let Some(missing) = driver::missing_library() {
                return Err(DeviceError::Missing(device, missing));
            }
            let driver = |e: cudarc::driver::DriverError| DeviceError::Driver {
                device,
                message: e.to_string(),
            };
            cudarc::driver::result::init().map_err(driver)?;
            let count = cudarc::driver::result::device::get_count().map_err(driver)? as usize;
            if index >= count {
                return Err(DeviceError::NoSuchGpu { device, count });
            }
            let timed = time_gemm_algorithms()?;
            let opened =
                CudaDevice::open(index, kernel_cache.join("nvrtc"), timed).map_err(|e| {
                    DeviceError::Driver {
                        device,
                        message: e.to_string(),
                    }
                })?;
            Ok(Some(Arc::new(opened)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_algorithms_are_timed_unless_told_otherwise() {
        assert!(parse_gemm_algorithm(None).unwrap());
        assert!(parse_gemm_algorithm(Some("timed")).unwrap());
        assert!(!parse_gemm_algorithm(Some("heuristic")).unwrap());
        let err = parse_gemm_algorithm(Some("fast")).unwrap_err().to_string();
        assert!(
            err.starts_with("KILN_GEMM_ALGORITHM=fast: expected timed"),
            "{err}"
        );
    }

    #[test]
    fn device_names_parse() {
        assert_eq!("cpu".parse::<DeviceChoice>().unwrap(), DeviceChoice::Cpu);
        assert_eq!(
            "gpu".parse::<DeviceChoice>().unwrap(),
            DeviceChoice::Cuda(0)
        );
        assert_eq!(
            "cuda".parse::<DeviceChoice>().unwrap(),
            DeviceChoice::Cuda(0)
        );
        assert_eq!(
            "gpu:3".parse::<DeviceChoice>().unwrap(),
            DeviceChoice::Cuda(3)
        );
        assert_eq!(
            "cuda:1".parse::<DeviceChoice>().unwrap(),
            DeviceChoice::Cuda(1)
        );
        assert_eq!(
            "cuda-emulated".parse::<DeviceChoice>().unwrap(),
            DeviceChoice::CudaEmulated
        );
        assert_eq!(
            "cuda-null".parse::<DeviceChoice>().unwrap(),
            DeviceChoice::CudaNull
        );
        for bad in ["tpu", "gpu:", "gpu:x", "GPU", "cuda:"] {
            let err = bad.parse::<DeviceChoice>().unwrap_err().to_string();
            assert!(
                err.contains("expected cpu, cuda, cuda:N, cuda-emulated or cuda-null"),
                "{err}"
            );
        }
    }

    #[test]
    fn a_missing_cuda_library_is_named_in_one_line() {
        let dir = std::env::temp_dir();
        match open(DeviceChoice::Cuda(0), dir) {
            Err(e) => {
                let err = e.to_string();
                assert!(err.starts_with("--device cuda:0: "), "{err}");
                assert!(!err.contains('\n'), "{err}");
                if driver::missing_library().is_some() {
                    assert!(
                        err.ends_with("could not be loaded; use --device cpu"),
                        "{err}"
                    );
                }
            }
            Ok(device) => println!("a GPU is present here: {}", device.unwrap().name()),
        }
        assert!(open(DeviceChoice::Cpu, std::env::temp_dir())
            .unwrap()
            .is_none());
    }
}
