//! Tells the benchmark crate's tests whether the build machine has AVX-512
//! VNNI (`cfg(host_avx512vnni)`), so that the test of the integer ceiling
//! loops is reported as ignored on CPUs without it, never as passed.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(host_avx512vnni)");
    let native = std::env::var("TARGET").ok() == std::env::var("HOST").ok();
    #[cfg(target_arch = "x86_64")]
    if native && std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw") && std::is_x86_feature_detected!("avx512vnni") {
        println!("cargo::rustc-cfg=host_avx512vnni");
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = native;
}
