//! Tells the engine's tests which AVX-512 kernels the build machine can run,
//! so that tests of kernels this CPU lacks are reported as ignored rather
//! than passing without running (`cfg(host_avx512)`: AVX-512 F/BW;
//! `cfg(host_avx512vnni)`: also VNNI, VL and AVX2/FMA/F16C; `cfg(host_amx)`:
//! also AMX-INT8 and AVX-512 VBMI).

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(host_avx512)");
    println!("cargo::rustc-check-cfg=cfg(host_avx512vnni)");
    println!("cargo::rustc-check-cfg=cfg(host_amx)");
    let native = std::env::var("TARGET").ok() == std::env::var("HOST").ok();
    #[cfg(target_arch = "x86_64")]
    if native {
        let has = |f: &str| match f {
            "avx512f" => std::is_x86_feature_detected!("avx512f"),
            "avx512bw" => std::is_x86_feature_detected!("avx512bw"),
            "avx512vl" => std::is_x86_feature_detected!("avx512vl"),
            "avx512vnni" => std::is_x86_feature_detected!("avx512vnni"),
            "avx2" => std::is_x86_feature_detected!("avx2"),
            "fma" => std::is_x86_feature_detected!("fma"),
            "f16c" => std::is_x86_feature_detected!("f16c"),
            "avx512vbmi" => std::is_x86_feature_detected!("avx512vbmi"),
            _ => false,
        };
        if has("avx512f") && has("avx512bw") {
            println!("cargo::rustc-cfg=host_avx512");
            if ["avx512vl", "avx512vnni", "avx2", "fma", "f16c"].into_iter().all(has) {
                println!("cargo::rustc-cfg=host_avx512vnni");
                if has_amx_int8() && has("avx512vbmi") {
                    println!("cargo::rustc-cfg=host_amx");
                }
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = native;
}

/// AMX-TILE and AMX-INT8 (CPUID leaf 7, EDX bits 24 and 25) with the tile
/// state enabled by the OS (XCR0 bits 17 and 18).
#[cfg(target_arch = "x86_64")]
fn has_amx_int8() -> bool {
    use std::arch::x86_64::{__cpuid_count, _xgetbv};
    if !std::is_x86_feature_detected!("xsave") {
        return false;
    }
    let edx = __cpuid_count(7, 0).edx;
    #[target_feature(enable = "xsave")]
    unsafe fn xcr0() -> u64 {
        // SAFETY: the caller checked XSAVE.
        unsafe { _xgetbv(0) }
    }
    // SAFETY: XSAVE was detected above.
    let xcr0 = unsafe { xcr0() };
    edx & (0b11 << 24) == 0b11 << 24 && xcr0 & (0b11 << 17) == 0b11 << 17
}
