//! What the device can do, measured: copy bandwidth (the decode roofline)
//! and the bf16 GEMM rate (the prefill roofline).

use std::time::Instant;

use kiln_kernels::cuda::{Device, DeviceError, DevicePtr, Gemm, GemmType, WeightLayout};

/// Device-to-device copy bandwidth, bytes read plus written per second: a
/// buffer of up to 256 MiB (an eighth of the free memory at most) copied
/// ten times after one warm-up copy.
pub fn copy_bandwidth(device: &dyn Device) -> Result<f64, DeviceError> {
    let (free, _) = device.memory()?;
    let bytes = (256usize << 20).min(free / 8).max(1 << 20);
    with_buffers(device, &[bytes, bytes], |b| {
        device.copy(b[1], b[0], bytes)?;
        device.synchronize()?;
        let started = Instant::now();
        for _ in 0..10 {
            device.copy(b[1], b[0], bytes)?;
        }
        device.synchronize()?;
        Ok(2.0 * 10.0 * bytes as f64 / started.elapsed().as_secs_f64())
    })
}

/// The rate of a square bf16 GEMM with f32 accumulation, in floating-point
/// operations a second. The size doubles from 256 until one product takes
/// 2 ms or the size reaches 8192 (where an H100 runs at its peak), so that
/// the kernel emulator measures a small one and a GPU a large one.
pub fn gemm_rate(device: &dyn Device) -> Result<f64, DeviceError> {
    let mut size = 256;
    loop {
        let (seconds, flops) = time_gemm(device, size)?;
        if seconds > 2e-3 || size >= 8192 {
            return Ok(flops / seconds);
        }
        size *= 2;
    }
}

/// Seconds per `size`³ bf16 product (the best of three after a warm-up) and
/// its floating-point operations.
fn time_gemm(device: &dyn Device, size: usize) -> Result<(f64, f64), DeviceError> {
    let operand = size * size * GemmType::BF16.size();
    with_buffers(device, &[operand, operand, size * size * 4], |b| {
        let gemm = Gemm {
            m: size,
            n: size,
            k: size,
            ty: GemmType::BF16,
            x: b[0],
            w: b[1],
            layout: WeightLayout::OutIn,
            y: b[2],
            y_type: GemmType::F32,
        };
        device.gemm(&gemm)?;
        device.synchronize()?;
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let started = Instant::now();
            device.gemm(&gemm)?;
            device.synchronize()?;
            best = best.min(started.elapsed().as_secs_f64());
        }
        Ok((best, 2.0 * (size as f64).powi(3)))
    })
}

/// Runs `f` on freshly allocated buffers of `sizes` bytes, freeing them after.
pub(super) fn with_buffers<T>(
    device: &dyn Device,
    sizes: &[usize],
    f: impl FnOnce(&[DevicePtr]) -> Result<T, DeviceError>,
) -> Result<T, DeviceError> {
    let mut buffers = Vec::with_capacity(sizes.len());
    let result = sizes
        .iter()
        .try_for_each(|&bytes| device.alloc(bytes).map(|ptr| buffers.push(ptr)))
        .and_then(|()| f(&buffers));
    for ptr in buffers {
        device.free(ptr);
    }
    result
}
