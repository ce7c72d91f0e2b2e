//! Choosing where a model runs: `--device cpu`, `gpu` or `gpu:N`. GPUs are
//! found through the CUDA driver, loaded at run time (cudarc's dynamic
//! loading), so this binary builds and runs on machines without CUDA.

use std::fmt;
use std::str::FromStr;

/// A device named on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The CPU backend.
    Cpu,
    /// CUDA device N (`gpu` is `gpu:0`).
    Gpu(usize),
}

impl FromStr for DeviceChoice {
    type Err = DeviceError;

    fn from_str(text: &str) -> Result<Self, DeviceError> {
        match text {
            "cpu" => Ok(DeviceChoice::Cpu),
            "gpu" => Ok(DeviceChoice::Gpu(0)),
            _ => text
                .strip_prefix("gpu:")
                .and_then(|n| n.parse().ok())
                .map(DeviceChoice::Gpu)
                .ok_or_else(|| DeviceError::Unknown(text.to_owned())),
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceChoice::Cpu => f.write_str("cpu"),
            DeviceChoice::Gpu(n) => write!(f, "gpu:{n}"),
        }
    }
}

/// Why a device cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// Not `cpu`, `gpu` or `gpu:N`.
    #[error("--device {0}: expected cpu, gpu or gpu:N")]
    Unknown(String),
    /// The CUDA driver library is not installed.
    #[error("--device {0}: no CUDA driver found (libcuda could not be loaded); use --device cpu")]
    NoDriver(DeviceChoice),
    /// The driver failed to start or to count devices.
    #[error("--device {device}: the CUDA driver failed: {message}")]
    Driver {
        /// The device asked for.
        device: DeviceChoice,
        /// The driver's error.
        message: String,
    },
    /// Fewer GPUs than the index asked for.
    #[error("--device {device}: this machine has {count} CUDA device(s)")]
    NoSuchGpu {
        /// The device asked for.
        device: DeviceChoice,
        /// GPUs present.
        count: usize,
    },
    /// A GPU is present but graphs cannot run on it yet.
    #[error(
        "--device {0}: found {1}, but this build cannot run graphs on a GPU yet; use --device cpu"
    )]
    NoGpuBackend(DeviceChoice, String),
}

/// Checks that the device can run a model: the CPU always can; a GPU needs
/// the CUDA driver, the device, and a GPU backend.
pub fn check(device: DeviceChoice) -> Result<(), DeviceError> {
    let DeviceChoice::Gpu(index) = device else {
        return Ok(());
    };
    // cudarc panics on first use of a missing library: probe first.
    if !driver_present() {
        return Err(DeviceError::NoDriver(device));
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
    let context = cudarc::driver::CudaContext::new(index).map_err(driver)?;
    let name = context.name().map_err(driver)?;
    Err(DeviceError::NoGpuBackend(device, name))
}

/// Whether the CUDA driver library can be loaded.
fn driver_present() -> bool {
    // SAFETY: this only tries to open libcuda by its known names (running the
    // library's initializers, as any use of the driver does).
    unsafe { cudarc::driver::sys::is_culib_present() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_parse() {
        assert_eq!("cpu".parse::<DeviceChoice>().unwrap(), DeviceChoice::Cpu);
        assert_eq!("gpu".parse::<DeviceChoice>().unwrap(), DeviceChoice::Gpu(0));
        assert_eq!(
            "gpu:3".parse::<DeviceChoice>().unwrap(),
            DeviceChoice::Gpu(3)
        );
        for bad in ["tpu", "gpu:", "gpu:x", "GPU"] {
            let err = bad.parse::<DeviceChoice>().unwrap_err().to_string();
            assert!(err.contains("expected cpu, gpu or gpu:N"), "{err}");
        }
    }

    #[test]
    fn a_gpu_is_refused_in_one_line_without_a_panic() {
        let err = check(DeviceChoice::Gpu(0)).unwrap_err().to_string();
        if driver_present() {
            println!("a CUDA driver is present here: {err}");
        } else {
            assert_eq!(
                err,
                "--device gpu:0: no CUDA driver found (libcuda could not be loaded); use --device cpu"
            );
        }
        assert!(!err.contains('\n'));
        check(DeviceChoice::Cpu).unwrap();
    }
}
