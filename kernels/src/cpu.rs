//! Run-time detection of the CPU's SIMD features, which the CPU kernels use to
//! choose an implementation (AVX-512 VNNI, AVX2/FMA, or portable code).

use std::fmt;

/// The SIMD features the CPU kernels can use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuFeatures {
    /// 256-bit integer and float SIMD.
    pub avx2: bool,
    /// Fused multiply-add.
    pub fma: bool,
    /// Half-precision conversions.
    pub f16c: bool,
    /// 512-bit SIMD (foundation and byte/word instructions).
    pub avx512: bool,
    /// 512-bit integer dot products (VNNI).
    pub avx512_vnni: bool,
    /// 512-bit byte permutes (VBMI).
    pub avx512_vbmi: bool,
    /// 256-bit integer dot products (AVX-VNNI).
    pub avx_vnni: bool,
}

impl CpuFeatures {
    /// Detects the features of the CPU this process runs on.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            Self {
                avx2: has!("avx2"),
                fma: has!("fma"),
                f16c: has!("f16c"),
                avx512: has!("avx512f") && has!("avx512bw"),
                avx512_vnni: has!("avx512vnni"),
                avx512_vbmi: has!("avx512vbmi"),
                avx_vnni: has!("avxvnni"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Self::default()
        }
    }
}

impl fmt::Display for CpuFeatures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let named = [
            ("avx2", self.avx2),
            ("fma", self.fma),
            ("f16c", self.f16c),
            ("avx512", self.avx512),
            ("avx512-vnni", self.avx512_vnni),
            ("avx512-vbmi", self.avx512_vbmi),
            ("avx-vnni", self.avx_vnni),
        ];
        let present: Vec<&str> = named
            .iter()
            .filter(|(_, on)| *on)
            .map(|(name, _)| *name)
            .collect();
        if present.is_empty() {
            f.write_str("portable (no SIMD extensions detected)")
        } else {
            f.write_str(&present.join(" "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_agrees_with_the_standard_library() {
        let features = CpuFeatures::detect();
        #[cfg(target_arch = "x86_64")]
        assert_eq!(features.avx2, std::arch::is_x86_feature_detected!("avx2"));
        // VNNI implies the 512-bit foundation it extends.
        assert!(!features.avx512_vnni || features.avx512 || !cfg!(target_arch = "x86_64"));
    }

    #[test]
    fn display_names_the_features() {
        let none = CpuFeatures::default();
        assert_eq!(none.to_string(), "portable (no SIMD extensions detected)");
        let some = CpuFeatures {
            avx2: true,
            fma: true,
            ..none
        };
        assert_eq!(some.to_string(), "avx2 fma");
    }
}
