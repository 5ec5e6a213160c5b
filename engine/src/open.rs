//! One way to open a model: [`open`] resolves the [`Device`], loads the
//! weights onto its backend, sizes the KV cache and hands back an
//! [`Executor`] with everything a server needs beside it. Nothing above the
//! engine knows which backends exist.

use crate::backend::cpu::CpuBackend;
use crate::backend::{self, Backend, KvSize};
use crate::error::{EngineError, Result};
use crate::gguf::GgufFile;
use crate::hf::HfModelDir;
use crate::kv::KvDtype;
use crate::load::{load_meta_from, ModelMeta};
use crate::model::{Decoder, LlamaWeights, MatmulPrecision, WeightNaming};
use crate::models::{resolve, ModelFormat};
use crate::runner::Executor;
use crate::weights::TensorSource;
use std::str::FromStr;

/// Where a model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// A GPU when this build has the CUDA backend and one is present, else the CPU.
    Auto,
    /// The CPU backend.
    Cpu,
    /// The CUDA backend on device N.
    Cuda(usize),
}

impl FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Self::Cuda)
                .ok_or_else(|| format!("`{s}` is not a device: use auto, cpu, cuda or cuda:N")),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Auto => write!(f, "auto"),
            Self::Cpu => write!(f, "cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// How to open a model: the KV cache's size and the backends' switches.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineOptions {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Exactly this many KV blocks (overrides the two budgets below).
    pub kv_blocks: Option<usize>,
    /// The CPU's KV cache budget, bytes.
    pub cpu_kv_bytes: usize,
    /// The fraction of GPU memory for weights, workspace and KV cache.
    pub gpu_memory_utilization: f64,
    /// CPU matmul precision.
    pub precision: MatmulPrecision,
    /// The CPU's KV cache dtype; `None` follows the precision (f16 fast,
    /// f32 exact). The CUDA backend's cache is bf16 either way.
    pub cpu_kv_dtype: Option<KvDtype>,
    /// Replay decode steps from CUDA graphs.
    pub cuda_graphs: bool,
    /// Sample on the GPU where its kernel reproduces the host sampler.
    pub device_sampling: bool,
    /// Run the GPU's linear layers on cuBLAS when it loads.
    pub cublas: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            block_size: 16,
            kv_blocks: None,
            cpu_kv_bytes: 1 << 30,
            gpu_memory_utilization: 0.9,
            precision: MatmulPrecision::Fast,
            cpu_kv_dtype: None,
            cuda_graphs: true,
            device_sampling: true,
            cublas: true,
        }
    }
}

/// An opened model: its executor and what turns text into its tokens.
pub struct OpenedModel {
    /// Runs steps over the model's KV cache.
    pub executor: Box<dyn Executor + Send>,
    /// The model's name, config, tokenizer and chat template.
    pub meta: ModelMeta,
    /// The device it runs on (never `Auto`).
    pub device: Device,
}

impl std::fmt::Debug for OpenedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenedModel").field("meta", &self.meta).field("device", &self.device).field("kv", &self.executor.kv_geometry()).finish()
    }
}

/// Load progress: `done` of `total` layers.
pub type Progress<'a> = &'a mut dyn FnMut(usize, usize);

/// `Auto` made concrete, with the reason logged; `Cuda` checked against
/// this build (a build without the backend cannot serve it).
pub fn resolve_device(device: Device) -> Result<Device> {
    let count = if backend::CUDA_BUILT { backend::cuda_device_count() } else { 0 };
    let (chosen, why) = choose_device(device, backend::CUDA_BUILT, count)?;
    match (device, chosen) {
        (Device::Auto, Device::Cpu) if backend::CUDA_BUILT => tracing::warn!("device auto: {why}; using the CPU"),
        (Device::Auto, _) => tracing::info!("device auto: {why}; using {chosen}"),
        _ => {}
    }
    Ok(chosen)
}

/// The device `device` comes to in a build with (`built`) or without the
/// CUDA backend on a machine with `gpus` devices, and why.
fn choose_device(device: Device, built: bool, gpus: usize) -> Result<(Device, String)> {
    match device {
        Device::Cpu => Ok((Device::Cpu, "asked for".into())),
        Device::Cuda(n) if built => Ok((Device::Cuda(n), "asked for".into())),
        Device::Cuda(_) => Err(EngineError::Backend(
            "--device cuda: this spindle was built without the CUDA backend (build with `--features cuda`; scripts/install-nvcc.sh installs nvcc)".into(),
        )),
        Device::Auto if !built => Ok((Device::Cpu, "this binary has no CUDA backend".into())),
        Device::Auto if gpus == 0 => Ok((Device::Cpu, "no CUDA driver or device on this machine".into())),
        Device::Auto => Ok((Device::Cuda(0), format!("{gpus} CUDA device(s) present"))),
    }
}

/// Why a CPU cache dtype the options ask for is not used: `auto` chose a
/// GPU, whose cache is bf16 (an explicit `cuda` with the option is refused
/// by the CLI before this).
fn unused_cpu_kv_dtype(asked: Device, resolved: Device, dtype: Option<KvDtype>) -> Option<String> {
    match (asked, resolved, dtype) {
        (Device::Auto, Device::Cuda(n), Some(d)) => {
            Some(format!("device auto chose cuda:{n}: the KV cache dtype {d:?} applies to the CPU's cache only; the GPU's cache is bf16"))
        }
        _ => None,
    }
}

/// A model's file or directory, opened once: its tensors and its metadata
/// (config, tokenizer, chat template), so a caller can tokenize before it
/// sizes the KV cache without reading the model twice.
pub struct ModelFiles {
    src: Box<dyn TensorSource>,
    naming: WeightNaming,
    /// The model's name, config, tokenizer and chat template.
    pub meta: ModelMeta,
}

impl std::fmt::Debug for ModelFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelFiles").field("meta", &self.meta).finish_non_exhaustive()
    }
}

impl ModelFiles {
    /// Opens `model` (a path or a cached name).
    pub fn load(model: &str) -> Result<Self> {
        let location = resolve(model)?;
        match location.format {
            ModelFormat::Gguf => {
                let file = GgufFile::open(&location.path)?;
                let meta = load_meta_from(location, &file)?;
                Ok(Self { src: Box::new(file), naming: WeightNaming::Gguf, meta })
            }
            ModelFormat::HfDir => {
                let dir = HfModelDir::open(&location.path)?;
                let meta = load_meta_from(location, &dir)?;
                Ok(Self { src: Box::new(dir), naming: WeightNaming::Hf, meta })
            }
        }
    }

    /// Loads the weights onto `device` (see [`open`]).
    pub fn open(self, device: Device, options: &EngineOptions, progress: Progress<'_>) -> Result<OpenedModel> {
        let resolved = resolve_device(device)?;
        let Self { mut src, naming, meta } = self;
        if let Device::Cuda(ordinal) = resolved {
            match backend::cuda_executor(ordinal, &meta, src.as_ref(), naming, options, progress) {
                Ok(executor) => {
                    if let Some(note) = unused_cpu_kv_dtype(device, resolved, options.cpu_kv_dtype) {
                        tracing::warn!("{note}");
                    }
                    return Ok(OpenedModel { executor, meta, device: resolved });
                }
                Err(e) if device == Device::Auto => tracing::warn!("device auto: cuda:{ordinal} cannot run this model ({e}); using the CPU"),
                Err(e) => return Err(e),
            }
        }
        move_to_huge_pages(src.as_mut());
        let backend = CpuBackend::new(options.precision).with_kv_dtype(options.cpu_kv_dtype);
        let kv = options.kv_blocks.map_or(KvSize::Bytes(options.cpu_kv_bytes), KvSize::Blocks);
        let executor = assemble(backend, &meta, src.as_ref(), naming, kv, options, progress)?;
        Ok(OpenedModel { executor, meta, device: Device::Cpu })
    }
}

/// Moves the CPU backend's weights into huge pages where the OS offers
/// them ([`TensorSource::move_to_huge_pages`]); a failure keeps the file's
/// map and is only worth a warning.
pub(crate) fn move_to_huge_pages(src: &mut dyn TensorSource) {
    match src.move_to_huge_pages() {
        Ok(true) => tracing::debug!("weights copied into huge pages"),
        Ok(false) if std::env::var_os("SPINDLE_HUGE_PAGES").is_some_and(|v| v == "1") => {
            tracing::info!("SPINDLE_HUGE_PAGES=1, but the weights stay where they are (not a GGUF file's own map, or no transparent huge pages here)")
        }
        Ok(false) => {}
        Err(e) => tracing::warn!("{e}; the weights stay in the file's memory map"),
    }
}

/// Opens `model` (a path or a cached name) on `device` with `options`.
/// `Auto` falls back to the CPU, with a warning, when the GPU it chose
/// cannot take the model; an explicit `cuda` never falls back.
pub fn open(model: &str, device: Device, options: &EngineOptions, progress: Progress<'_>) -> Result<OpenedModel> {
    ModelFiles::load(model)?.open(device, options, progress)
}

/// Opens `model` (a path or a cached name) as a typed decoder on the backend
/// `make_backend` builds for its config, with a KV cache of `kv` in blocks
/// of `block_size`: for tests and benchmarks that drive one backend
/// directly (servers use [`open`]).
pub fn open_decoder<B: Backend>(model: &str, make_backend: impl FnOnce(&crate::config::ModelConfig) -> Result<B>, kv: KvSize, block_size: usize) -> Result<(Decoder<B>, ModelMeta)> {
    let ModelFiles { src, naming, meta } = ModelFiles::load(model)?;
    let backend = make_backend(&meta.config)?;
    let weights = LlamaWeights::load(&backend, meta.config.clone(), src.as_ref(), naming, &mut |_, _| {})?;
    Ok((Decoder::with_backend(weights, backend, kv, block_size)?, meta))
}

/// Loads the weights onto `backend` and sizes its cache.
pub(crate) fn assemble<B: Backend + 'static>(backend: B, meta: &ModelMeta, src: &dyn TensorSource, naming: WeightNaming, kv: KvSize, options: &EngineOptions, progress: Progress<'_>) -> Result<Box<dyn Executor + Send>> {
    let weights = LlamaWeights::load(&backend, meta.config.clone(), src, naming, progress)?;
    let mut decoder = Decoder::with_backend(weights, backend, kv, options.block_size)?;
    decoder.set_device_sampling(options.device_sampling);
    let g = decoder.kv_geometry();
    tracing::info!(
        "model {} ({:.0} MB weights) on {}; KV cache {} blocks = {} tokens ({:.0} MB)",
        meta.location.name,
        decoder.weight_bytes() as f64 / 1e6,
        decoder.backend().describe(),
        g.num_blocks,
        g.tokens(),
        (g.num_blocks * g.bytes_per_block) as f64 / 1e6
    );
    Ok(Box::new(decoder))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_print_and_unknown_ones_are_errors() {
        assert_eq!("auto".parse::<Device>(), Ok(Device::Auto));
        assert_eq!("cpu".parse::<Device>(), Ok(Device::Cpu));
        assert_eq!("cuda".parse::<Device>(), Ok(Device::Cuda(0)));
        assert_eq!("cuda:3".parse::<Device>(), Ok(Device::Cuda(3)));
        assert_eq!(Device::Cuda(3).to_string(), "cuda:3");
        for bad in ["gpu", "cuda:", "cuda:x", ""] {
            assert!(bad.parse::<Device>().unwrap_err().contains("is not a device"), "{bad}");
        }
    }

    #[test]
    fn auto_takes_a_gpu_only_when_built_and_present_and_cuda_needs_the_backend() {
        assert_eq!(choose_device(Device::Auto, false, 4).unwrap().0, Device::Cpu);
        assert_eq!(choose_device(Device::Auto, true, 0).unwrap().0, Device::Cpu);
        assert_eq!(choose_device(Device::Auto, true, 2).unwrap().0, Device::Cuda(0));
        let note = unused_cpu_kv_dtype(Device::Auto, Device::Cuda(0), Some(KvDtype::F16)).expect("auto on a GPU drops the CPU dtype");
        assert!(note.contains("cuda:0") && note.contains("F16") && note.contains("bf16"), "{note}");
        assert_eq!(unused_cpu_kv_dtype(Device::Auto, Device::Cpu, Some(KvDtype::F16)), None, "the CPU uses it");
        assert_eq!(unused_cpu_kv_dtype(Device::Auto, Device::Cuda(0), None), None, "nothing asked");
        assert_eq!(choose_device(Device::Cuda(1), true, 0).unwrap().0, Device::Cuda(1), "an explicit GPU is never swapped for the CPU");
        let err = choose_device(Device::Cuda(0), false, 0).unwrap_err().to_string();
        assert!(err.contains("built without the CUDA backend"), "{err}");
        assert_eq!(choose_device(Device::Cpu, true, 8).unwrap().0, Device::Cpu);
    }
}
