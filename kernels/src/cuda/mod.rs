//! The CUDA side of the shared kernels: CUDA C sources (hand-written under
//! `kernels/cuda/`, embedded), the [`Device`] interface the CUDA backend runs
//! on, and its implementations: the real GPU through the driver, NVRTC
//! and cuBLAS ([`driver`]), the kernel [`emulator`] that runs the same
//! sources on the CPU, and the [`null`] device that runs nothing (the host's
//! share of a step, measured alone).

mod captures;
pub mod cubin_cache;
mod cublas;
pub mod device;
pub mod driver;
mod driver_launch;
pub mod emulator;
pub mod flash;
pub mod null;
pub mod nvrtc;
mod pinned;
pub mod sources;

pub use device::{
    float_pair_word, row_norm_arg, Device, DeviceError, DevicePtr, DeviceResult, DriverCall,
    DriverSeconds, FunctionId, Gemm, GemmType, GraphId, KernelArg, LaunchConfig, Readback,
    RowNormArgs, WeightLayout,
};
