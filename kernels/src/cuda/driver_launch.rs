//! Kernel launches on the real driver past a plain `cuLaunchKernel`: the
//! programmatic dependent launch and the opt-in to dynamic shared memory
//! past 48 KiB.

use cudarc::driver::sys;

use super::device::{DeviceError, DeviceResult, FunctionId, LaunchConfig, PackedArgs};
use super::driver::driver_error;

/// Lets `f` (function `id`) take `bytes` of dynamic shared memory where that
/// is past the 48 KiB every kernel may take without asking
/// (`LaunchConfig::check` holds launches to what every sm_80+ card allows).
pub(super) fn opt_in_shared(
    opted_in: &mut [u32],
    id: FunctionId,
    f: sys::CUfunction,
    bytes: u32,
) -> DeviceResult<()> {
    if bytes <= 48 * 1024 {
        return Ok(());
    }
    if opted_in[id.0] >= bytes {
        return Ok(());
    }
    // SAFETY: `f` is a loaded function of this context, bound by the caller.
    unsafe {
        sys::cuFuncSetAttribute(
            f,
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        )
    }
    .result()
    .map_err(|e| {
        DeviceError::new(format!(
            "cuFuncSetAttribute (dynamic shared memory of {bytes} bytes): {e}"
        ))
    })?;
    opted_in[id.0] = bytes;
    Ok(())
}

/// Launches `f` as a programmatic dependent of the stream's previous
/// kernel (`cuLaunchKernelEx`): its blocks may start once every block of
/// that kernel has called `kiln_wait_inputs()`, and their own
/// `kiln_wait_inputs()` waits for its completion. Captured into a graph,
/// the dependency becomes a programmatic edge.
pub(super) fn launch_programmatic(
    stream: sys::CUstream,
    f: sys::CUfunction,
    config: LaunchConfig,
    packed: &mut PackedArgs,
) -> DeviceResult<()> {
    // SAFETY: an all-zero attribute value is a valid union state.
    let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
    value.programmaticStreamSerializationAllowed = 1;
    let mut attribute = sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        value,
    };
    let launch = sys::CUlaunchConfig {
        gridDimX: config.grid.0,
        gridDimY: config.grid.1,
        gridDimZ: config.grid.2,
        blockDimX: config.block.0,
        blockDimY: config.block.1,
        blockDimZ: config.block.2,
        sharedMemBytes: config.shared_bytes,
        hStream: stream,
        attrs: &mut attribute,
        numAttrs: 1,
    };
    // SAFETY: as in `CudaDevice::launch`: the arguments match the kernel's
    // signature; the configuration and its attribute outlive the call,
    // which copies them.
    unsafe {
        sys::cuLaunchKernelEx(
            &launch,
            f,
            packed.pointers().as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()
    .map_err(driver_error("cuLaunchKernelEx"))
}
