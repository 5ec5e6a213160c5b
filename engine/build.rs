//! Tells the engine's tests which AVX-512 kernels the build machine can run,
//! so that tests of kernels this CPU lacks are reported as ignored rather
//! than passing without running (`cfg(host_avx512)`: AVX-512 F/BW;
//! `cfg(host_avx512vnni)`: also VNNI, VL and AVX2/FMA/F16C).

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(host_avx512)");
    println!("cargo::rustc-check-cfg=cfg(host_avx512vnni)");
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
            _ => false,
        };
        if has("avx512f") && has("avx512bw") {
            println!("cargo::rustc-cfg=host_avx512");
            if ["avx512vl", "avx512vnni", "avx2", "fma", "f16c"].into_iter().all(has) {
                println!("cargo::rustc-cfg=host_avx512vnni");
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = native;
}
