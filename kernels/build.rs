//! With the `cuda` feature: compiles every `cuda/*.cu` with nvcc into a cubin
//! for sm_90a (H100/H200) and PTX for compute_90 (JIT on later GPUs), and
//! writes `kernels.rs` (in OUT_DIR) embedding them. nvcc comes from `NVCC`,
//! `CUDA_HOME/bin`, the project's `.venv-cuda` (scripts/install-nvcc.sh) or
//! `PATH`; without one the build fails, so kernels can never rot unnoticed.
//! Without the feature nothing is compiled.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=cuda");
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let nvcc = find_nvcc(&manifest).unwrap_or_else(|| {
        panic!("the `cuda` feature needs nvcc 13.0: run scripts/install-nvcc.sh, or set NVCC or CUDA_HOME")
    });
    let mut sources: Vec<PathBuf> = std::fs::read_dir(manifest.join("cuda"))
        .expect("kernels/cuda")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    sources.sort();
    let mut generated = String::from("/// The compiled kernel files.\npub const MODULES: &[Module] = &[\n");
    for src in &sources {
        println!("cargo:rerun-if-changed={}", src.display());
        let name = src.file_stem().and_then(|s| s.to_str()).expect("file name").to_string();
        let cubin = out.join(format!("{name}.cubin"));
        let ptx = out.join(format!("{name}.ptx"));
        compile(&nvcc, src, &["-cubin", "-arch=sm_90a"], &cubin);
        compile(&nvcc, src, &["-ptx", "-arch=compute_90"], &ptx);
        let text = std::fs::read_to_string(src).expect("read .cu");
        let functions: Vec<String> = kernel_names(&text).into_iter().map(|f| format!("{f:?}")).collect();
        let _ = writeln!(
            generated,
            "    Module {{ name: {name:?}, cubin: include_bytes!({:?}), ptx: include_str!({:?}), functions: &[{}] }},",
            cubin.display().to_string(),
            ptx.display().to_string(),
            functions.join(", ")
        );
    }
    generated.push_str("];\n");
    std::fs::write(out.join("kernels.rs"), generated).expect("write kernels.rs");
}

fn compile(nvcc: &Path, src: &Path, mode: &[&str], output: &Path) {
    let status = Command::new(nvcc)
        .args(mode)
        .args(["-O3", "-std=c++17", "-lineinfo", "-o"])
        .arg(output)
        .arg(src)
        .status()
        .unwrap_or_else(|e| panic!("running {}: {e}", nvcc.display()));
    assert!(status.success(), "nvcc failed on {}", src.display());
}

/// Names of `extern "C" __global__ void [__launch_bounds__(N)] name(`
/// kernels in a source file.
fn kernel_names(source: &str) -> Vec<String> {
    source
        .split("extern \"C\" __global__ void ")
        .skip(1)
        // `__launch_bounds__(N)` may come before the name.
        .map(|rest| rest.strip_prefix("__launch_bounds__(").and_then(|r| r.split_once(')')).map_or(rest, |(_, r)| r))
        .filter_map(|rest| rest.split('(').next())
        .map(|n| n.trim().to_string())
        .collect()
}

fn find_nvcc(manifest: &Path) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NVCC") {
        return Some(PathBuf::from(p));
    }
    if let Some(home) = std::env::var_os("CUDA_HOME") {
        let p = PathBuf::from(home).join("bin/nvcc");
        if p.is_file() {
            return Some(p);
        }
    }
    let venv_lib = manifest.parent()?.join(".venv-cuda/lib");
    if let Ok(entries) = std::fs::read_dir(&venv_lib) {
        for e in entries.flatten() {
            let p = e.path().join("site-packages/nvidia/cu13/bin/nvcc");
            if p.is_file() {
                return Some(p);
            }
        }
    }
    std::env::var_os("PATH").and_then(|paths| std::env::split_paths(&paths).map(|d| d.join("nvcc")).find(|p| p.is_file()))
}
