//! CUDA C to GPU code with NVRTC (loaded at run time through cudarc).
//!
//! NVRTC needs `libnvrtc.so.13` and `libnvrtc-builtins.so.13.0`. On a GPU
//! machine they come with the CUDA toolkit or the `nvidia-cuda-nvrtc` wheel;
//! [`preload`] opens them from a folder by absolute path, so a process finds
//! them without `LD_LIBRARY_PATH` (the dynamic loader matches the already
//! loaded libraries by their soname when cudarc opens `libnvrtc.so.13`).

use std::ffi::{c_char, CStr, CString};
use std::path::Path;

use cudarc::nvrtc::{result, sys};

use super::device::DeviceError;
use super::sources::inline_common_header;

/// Output of one compilation.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// PTX text (for `compute_XX`) or a cubin (for `sm_XX`).
    pub image: Vec<u8>,
    /// NVRTC's log (warnings; ptxas statistics with `verbose_ptxas`).
    pub log: String,
}

/// Opens NVRTC and its builtins from `dir` (a `.../nvidia/cu13/lib` folder)
/// so later lookups by name find them. The handles stay open for the life of
/// the process.
pub fn preload(dir: &Path) -> Result<(), DeviceError> {
    for name in ["libnvrtc-builtins.so.13.0", "libnvrtc.so.13"] {
        let path = dir.join(name);
        // SAFETY: loading NVIDIA's NVRTC libraries runs only their own
        // initializers.
        let library = unsafe { libloading::Library::new(&path) }
            .map_err(|e| DeviceError::new(format!("cannot load {}: {e}", path.display())))?;
        std::mem::forget(library);
    }
    Ok(())
}

/// Whether NVRTC can be loaded.
pub fn available() -> bool {
    // SAFETY: this only tries to open the library by its known names.
    unsafe { sys::is_culib_present() }
}

/// NVRTC's version, e.g. `(13, 0)`.
pub fn version() -> Result<(i32, i32), DeviceError> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC writes two ints.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| DeviceError::new(format!("nvrtcVersion: {e:?}")))?;
    Ok((major, minor))
}

/// NVRTC's options besides the architecture (part of a cached cubin's key).
pub const OPTIONS: [&str; 2] = ["--std=c++17", "--fmad=false"];

/// The architectures the CUDA backend compiles for, as NVRTC names them (one
/// per supported compute capability: [`arch_of`]).
pub const ARCHS: [&str; 6] = ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"];

/// NVRTC's architecture for a GPU of compute capability `major.minor`, if
/// the CUDA backend supports it (8.0 and newer).
pub fn arch_of(major: i32, minor: i32) -> Option<&'static str> {
    Some(match (major, minor) {
        (8, 0) => "sm_80",
        (8, 6) => "sm_86",
        (8, 9) => "sm_89",
        (9, _) => "sm_90",
        (10, _) => "sm_100",
        (12, _) => "sm_120",
        _ => return None,
    })
}

/// Compiles `source` for `arch` (`compute_80` gives PTX, `sm_90` a cubin).
/// With `verbose_ptxas`, the log carries ptxas's registers and spills per
/// kernel (cubin targets only).
pub fn compile(
    name: &str,
    source: &str,
    arch: &str,
    verbose_ptxas: bool,
) -> Result<Compiled, DeviceError> {
    let text = CString::new(inline_common_header(name, source))
        .map_err(|_| DeviceError::new(format!("{name}: source contains a NUL byte")))?;
    let c_name = CString::new(name).map_err(|_| DeviceError::new("bad source name"))?;
    let program = result::create_program(&text, Some(&c_name))
        .map_err(|e| DeviceError::new(format!("{name}: nvrtcCreateProgram: {e:?}")))?;
    let mut options = vec![format!("--gpu-architecture={arch}")];
    options.extend(OPTIONS.iter().map(|o| (*o).to_owned()));
    if verbose_ptxas {
        options.push("--ptxas-options=-v".to_owned());
    }
    // SAFETY: `program` is live until destroyed below; NVRTC owns nothing of ours.
    let outcome = unsafe {
        let compiled = result::compile_program(program, &options);
        let log = result::get_program_log(program)
            .map(|raw| c_text(&raw))
            .unwrap_or_default();
        let image = match compiled {
            Err(e) => Err(DeviceError::new(format!(
                "{name} for {arch}: NVRTC failed ({e:?}):\n{log}"
            ))),
            Ok(()) if arch.starts_with("sm_") => cubin(program)
                .map_err(|e| DeviceError::new(format!("{name} for {arch}: nvrtcGetCUBIN: {e:?}"))),
            Ok(()) => result::get_ptx(program)
                .map(|raw| c_text(&raw).into_bytes())
                .map_err(|e| DeviceError::new(format!("{name} for {arch}: nvrtcGetPTX: {e:?}"))),
        };
        let _ = result::destroy_program(program);
        image.map(|image| Compiled { image, log })
    };
    outcome
}

/// # Safety
/// `program` must be a live, successfully compiled program.
unsafe fn cubin(program: sys::nvrtcProgram) -> Result<Vec<u8>, sys::nvrtcResult> {
    let mut size = 0usize;
    let status = sys::nvrtcGetCUBINSize(program, &mut size);
    if status != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(status);
    }
    let mut image = vec![0u8; size];
    let status = sys::nvrtcGetCUBIN(program, image.as_mut_ptr().cast::<c_char>());
    if status != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(status);
    }
    Ok(image)
}

fn c_text(raw: &[c_char]) -> String {
    let bytes: Vec<u8> = raw.iter().map(|&c| c as u8).collect();
    CStr::from_bytes_until_nul(&bytes)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned())
}

/// Per-kernel ptxas statistics parsed from a verbose log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelStats {
    /// The kernel.
    pub name: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of spill stores.
    pub spill_stores: u32,
    /// Bytes of spill loads.
    pub spill_loads: u32,
    /// Bytes of each thread's stack frame (local arrays, calls' saved
    /// registers, and any kernel parameter whose address is taken, copied).
    pub stack_frame: u32,
}

/// Reads `ptxas info` lines: a `Compiling entry function 'K'` line names the
/// kernel; the lines up to the next give its registers, its stack (the
/// `Used` line's cumulative size over the calls, or its own frame) and the
/// spills of K and of the non-inlined functions it calls, whose
/// `Function properties` blocks follow K's.
pub fn parse_ptxas_log(log: &str) -> Vec<KernelStats> {
    let mut stats: Vec<KernelStats> = Vec::new();
    let number_before = |line: &str, word: &str| -> Option<u32> {
        let at = line.find(word)?;
        line[..at].split_whitespace().last()?.parse().ok()
    };
    // Whether the last `Function properties` block is the kernel's own.
    let mut own_properties = false;
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_owned();
            stats.push(KernelStats {
                name,
                registers: 0,
                spill_stores: 0,
                spill_loads: 0,
                stack_frame: 0,
            });
        } else if let Some(current) = stats.last_mut() {
            if let Some(function) = line.split("Function properties for ").nth(1) {
                own_properties = function.trim() == current.name;
            }
            if let Some(n) = number_before(line, "bytes spill stores") {
                current.spill_stores += n;
            }
            if let Some(n) = number_before(line, "bytes spill loads") {
                current.spill_loads += n;
            }
            if let Some(n) = number_before(line, "bytes stack frame").filter(|_| own_properties) {
                current.stack_frame = current.stack_frame.max(n);
            }
            if let Some(n) = number_before(line, "bytes cumulative stack size") {
                current.stack_frame = current.stack_frame.max(n);
            }
            if let Some(n) = number_before(line, "registers") {
                current.registers = n;
            }
        }
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernels_stack_is_its_own_not_its_callees() {
        let log = "ptxas info    : Compiling entry function 'k' for 'sm_90'
ptxas info    : Function properties for k
ptxas         .     336 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 56 registers, used 1 barriers, 336 bytes cumulative stack size, 264 bytes smem
ptxas info    : Function properties for _Z17write_norm_scalesPKfPffii
ptxas         .     0 bytes stack frame, 4 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'plain' for 'sm_90'
ptxas info    : Function properties for plain
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 20 registers, used 0 barriers
";
        let stats = parse_ptxas_log(log);
        assert_eq!(
            stats,
            [
                KernelStats {
                    name: "k".into(),
                    registers: 56,
                    spill_stores: 12,
                    spill_loads: 4,
                    stack_frame: 336,
                },
                KernelStats {
                    name: "plain".into(),
                    registers: 20,
                    spill_stores: 0,
                    spill_loads: 0,
                    stack_frame: 0,
                },
            ]
        );
    }

    #[test]
    fn every_supported_capability_has_one_of_the_listed_architectures() {
        let capabilities = [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)];
        let archs: Vec<_> = capabilities
            .iter()
            .map(|&(a, b)| arch_of(a, b).unwrap())
            .collect();
        assert_eq!(archs, ARCHS);
        assert_eq!(
            arch_of(7, 5),
            None,
            "sm_75 has no bf16 tensor-core products"
        );
        assert_eq!(arch_of(9, 0), arch_of(9, 1));
    }
}
