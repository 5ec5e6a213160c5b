//! The engine's options on the command line (`--device`, the KV cache's
//! size, the backends' switches), shared by `serve` and `generate`, and
//! starting a model behind a scheduler. Which backends exist, and how a
//! device is opened, is the engine's business (`spindle_engine::open`).

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use spindle_engine::kv::KvDtype;
use spindle_engine::model::MatmulPrecision;
use spindle_engine::models::DEFAULT_MODEL;
use spindle_engine::open::ModelFiles;
use spindle_engine::{Device, EngineOptions, OpenedModel};
use spindle_scheduler::{SchedulerConfig, SchedulerHandle};

/// Matmul precision on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Precision {
    /// 8-bit activations with integer SIMD kernels.
    Fast,
    /// f32 activations and dequantized weights (slow; for validation; CPU only).
    Exact,
}

/// The CPU KV cache's element type on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KvCacheDtype {
    /// Half precision: half the memory and the bytes read per token.
    F16,
    /// Full precision.
    F32,
}

/// Tokens per KV block.
pub const BLOCK_SIZE: usize = 16;

/// Where and how the model runs.
#[derive(Args, Clone, Debug)]
pub struct EngineArgs {
    /// Model name in the cache, or a path to a GGUF file or HF directory.
    #[arg(long, env = "SPINDLE_MODEL", default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Where the model runs: auto (a GPU when there is one), cpu, cuda or cuda:N.
    #[arg(long, env = "SPINDLE_DEVICE", default_value = "auto")]
    pub device: Device,
    /// Memory for the KV cache on the CPU, in MiB (on a GPU: --gpu-memory-utilization).
    #[arg(long, env = "SPINDLE_KV_CACHE_MIB", default_value_t = 1024)]
    pub kv_cache_memory_mib: usize,
    /// Fraction of the GPU's memory for weights, activations and the KV cache (the rest of it goes to the KV cache).
    #[arg(long, env = "SPINDLE_GPU_MEMORY_UTILIZATION", default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// Matmul precision of the CPU backend.
    #[arg(long, env = "SPINDLE_PRECISION", value_enum, default_value = "fast")]
    pub precision: Precision,
    /// The CPU's KV cache dtype (default: f16 with --precision fast, f32 with exact; the GPU's cache is bf16).
    #[arg(long, env = "SPINDLE_KV_CACHE_DTYPE", value_enum)]
    pub kv_cache_dtype: Option<KvCacheDtype>,
    /// GPU: launch every decode step's kernels instead of replaying CUDA graphs.
    #[arg(long, env = "SPINDLE_NO_CUDA_GRAPHS", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub no_cuda_graphs: bool,
    /// GPU: copy logits to the host and sample there instead of on the device.
    #[arg(long, env = "SPINDLE_HOST_SAMPLING", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub host_sampling: bool,
    /// GPU: run linear layers on Spindle's GEMM kernels even where cuBLAS loads.
    #[arg(long, env = "SPINDLE_NO_CUBLAS", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub no_cublas: bool,
    /// Worker threads (default: all cores).
    #[arg(long, env = "SPINDLE_THREADS")]
    pub threads: Option<usize>,
}

impl EngineArgs {
    /// The engine's options these flags ask for; `kv_blocks` fixes the
    /// cache's size in blocks instead of the memory budgets.
    pub fn options(&self, kv_blocks: Option<usize>) -> EngineOptions {
        EngineOptions {
            block_size: BLOCK_SIZE,
            kv_blocks,
            cpu_kv_bytes: self.kv_cache_memory_mib << 20,
            gpu_memory_utilization: self.gpu_memory_utilization,
            precision: match self.precision {
                Precision::Fast => MatmulPrecision::Fast,
                Precision::Exact => MatmulPrecision::Exact,
            },
            cpu_kv_dtype: self.kv_cache_dtype.map(|d| match d {
                KvCacheDtype::F16 => KvDtype::F16,
                KvCacheDtype::F32 => KvDtype::F32,
            }),
            cuda_graphs: !self.no_cuda_graphs,
            device_sampling: !self.host_sampling,
            cublas: !self.no_cublas,
        }
    }

    /// The device to open: `--precision exact` is a CPU mode, so `auto`
    /// takes the CPU with it and an explicit GPU is an error.
    pub fn device(&self) -> anyhow::Result<Device> {
        match (self.device, self.precision) {
            (Device::Auto, Precision::Exact) => {
                tracing::info!("--precision exact is a CPU mode; using the CPU");
                Ok(Device::Cpu)
            }
            (Device::Cuda(_), Precision::Exact) => anyhow::bail!("--precision exact is a CPU mode (the GPU runs bf16)"),
            (Device::Cuda(_), _) if self.kv_cache_dtype.is_some() => anyhow::bail!("--kv-cache-dtype sets the CPU's cache (the GPU's is bf16)"),
            (d, _) => Ok(d),
        }
    }

    /// Opens the model (with a progress bar on stderr).
    pub fn open(&self, kv_blocks: Option<usize>) -> anyhow::Result<OpenedModel> {
        self.open_files(ModelFiles::load(&self.model)?, kv_blocks)
    }

    /// Loads the weights of an already opened model (with a progress bar).
    pub fn open_files(&self, files: ModelFiles, kv_blocks: Option<usize>) -> anyhow::Result<OpenedModel> {
        let device = self.device()?;
        let bar = ProgressBar::new(0);
        bar.set_style(ProgressStyle::with_template("loading {msg} [{bar:30}] {pos}/{len} layers")?.progress_chars("=> "));
        bar.set_message(self.model.clone());
        let opened = files.open(device, &self.options(kv_blocks), &mut |done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        });
        bar.finish_and_clear();
        Ok(opened?)
    }
}

/// A model running behind a scheduler, and what the server needs of it.
pub struct Started {
    /// The scheduler driving the model's executor.
    pub scheduler: SchedulerHandle,
    /// The model's name, config, tokenizer and chat template.
    pub meta: spindle_engine::load::ModelMeta,
    /// Device telemetry, when the backend has it.
    pub telemetry: Option<std::sync::Arc<dyn spindle_engine::runner::DeviceTelemetry>>,
}

/// Starts a scheduler with `config` over an opened model.
pub fn start(opened: OpenedModel, config: SchedulerConfig) -> Started {
    let telemetry = opened.executor.telemetry();
    let scheduler = SchedulerHandle::spawn(config, opened.executor, opened.meta.tokenizer.clone());
    Started { scheduler, meta: opened.meta, telemetry }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        engine: EngineArgs,
    }

    #[test]
    fn flags_become_engine_options() -> Result<(), clap::Error> {
        let cli = Cli::try_parse_from(["x", "--device", "cuda:1", "--no-cuda-graphs", "--host-sampling", "--kv-cache-memory-mib", "64"])?;
        assert_eq!(cli.engine.device, Device::Cuda(1));
        let o = cli.engine.options(None);
        assert!(!o.cuda_graphs && !o.device_sampling && o.cublas);
        assert_eq!(o.cpu_kv_bytes, 64 << 20);
        assert_eq!(o.cpu_kv_dtype, None, "the cache dtype follows the precision unless asked for");
        let cli = Cli::try_parse_from(["x", "--kv-cache-dtype", "f32"])?;
        assert_eq!(cli.engine.options(None).cpu_kv_dtype, Some(KvDtype::F32));
        assert!(Cli::try_parse_from(["x", "--kv-cache-dtype", "q8"]).is_err(), "an unknown dtype is a usage error");
        assert!(Cli::try_parse_from(["x", "--device", "gpu"]).is_err(), "an unknown device is a usage error");
        Ok(())
    }

    #[test]
    fn exact_precision_is_a_cpu_mode() -> anyhow::Result<()> {
        let cli = Cli::try_parse_from(["x", "--precision", "exact"])?;
        assert_eq!(cli.engine.device()?, Device::Cpu);
        let cli = Cli::try_parse_from(["x", "--precision", "exact", "--device", "cuda"])?;
        let err = cli.engine.device().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("CPU mode"), "an explicit GPU with exact precision is an error: {err:?}");
        let cli = Cli::try_parse_from(["x", "--kv-cache-dtype", "f32", "--device", "cuda"])?;
        let err = cli.engine.device().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("CPU's cache"), "an explicit GPU with a CPU cache dtype is an error: {err:?}");
        Ok(())
    }
}
