//! `--device auto|cpu|cuda[:N]`: where the model runs. `auto` picks the
//! first GPU when this binary has the CUDA backend (feature `cuda`) and a
//! driver with a device is present, else the CPU, and the start-up log says
//! which and why. `cuda` without the backend or without a GPU is an error.

use spindle_engine::chat_template::ChatTemplate;
use spindle_engine::config::ModelConfig;
use spindle_engine::tokenizer::Tokenizer;
use spindle_scheduler::SchedulerHandle;
use std::str::FromStr;

/// A device as asked for on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// A GPU when there is one, else the CPU.
    Auto,
    /// The CPU backend.
    Cpu,
    /// The CUDA backend on device N.
    Cuda(usize),
}

impl FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
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

/// A model running behind a scheduler, and what the server needs of it.
pub struct Started {
    /// The scheduler driving the backend.
    pub scheduler: SchedulerHandle,
    /// The served model name.
    pub name: String,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// Its chat template.
    pub template: ChatTemplate,
    /// Its hyper-parameters.
    pub config: ModelConfig,
}

/// `Auto` made concrete (logged); `Cuda` checked against this build.
pub fn resolve(device: Device) -> anyhow::Result<Device> {
    match device {
        Device::Cpu => Ok(Device::Cpu),
        Device::Cuda(n) => {
            if cfg!(feature = "cuda") {
                Ok(Device::Cuda(n))
            } else {
                anyhow::bail!("--device cuda: this spindle was built without the CUDA backend (build with `--features cuda`; scripts/install-nvcc.sh installs nvcc)")
            }
        }
        Device::Auto => Ok(auto()),
    }
}

fn auto() -> Device {
    if !cfg!(feature = "cuda") {
        tracing::info!("device auto: this binary has no CUDA backend; using the CPU");
        Device::Cpu
    } else if gpu_count() > 0 {
        tracing::info!("device auto: {} CUDA device(s) present; using cuda:0", gpu_count());
        Device::Cuda(0)
    } else {
        tracing::info!("device auto: no CUDA driver or device on this machine; using the CPU");
        Device::Cpu
    }
}

/// CUDA devices present (0 without the backend or a driver).
fn gpu_count() -> usize {
    #[cfg(feature = "cuda")]
    {
        spindle_engine::cuda::device_count()
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}

/// Loads `model` onto GPU `ordinal` (KV cache from `memory_fraction` of its
/// memory) and starts a scheduler over it; `sched` makes the scheduler's
/// config from the number of KV blocks, the model's config and its path.
#[cfg(feature = "cuda")]
pub fn start_cuda(
    model: &str,
    ordinal: usize,
    memory_fraction: f64,
    block_size: usize,
    sched: impl FnOnce(usize, &ModelConfig, &std::path::Path) -> spindle_scheduler::SchedulerConfig,
) -> anyhow::Result<Started> {
    use spindle_engine::cuda::{CudaModel, CudaRunner, KvSize};
    let meta = spindle_engine::load::load_meta(model)?;
    let gpu = CudaModel::open(model, ordinal, KvSize::MemoryFraction(memory_fraction), block_size)?;
    tracing::info!(
        "model {} ({:.0} MB bf16 weights) on cuda:{ordinal} ({}); KV cache {} blocks = {} tokens",
        meta.location.name,
        gpu.weight_bytes() as f64 / 1e6,
        gpu.device_name(),
        gpu.num_blocks(),
        gpu.num_blocks() * block_size
    );
    tracing::info!("linear layers: {}", gpu.gemm_backend());
    if let Some(uuid) = gpu.device_uuid() {
        spindle_server::app::gpu_stats::install(&uuid);
    }
    let config = sched(gpu.num_blocks(), &meta.config, &meta.location.path);
    let scheduler = SchedulerHandle::spawn(config, CudaRunner::new(gpu), meta.tokenizer.clone());
    Ok(Started { scheduler, name: meta.location.name, tokenizer: meta.tokenizer, template: meta.template, config: meta.config })
}

/// Without the CUDA backend `resolve` never yields `Cuda`.
#[cfg(not(feature = "cuda"))]
pub fn start_cuda(
    _model: &str,
    _ordinal: usize,
    _memory_fraction: f64,
    _block_size: usize,
    _sched: impl FnOnce(usize, &ModelConfig, &std::path::Path) -> spindle_scheduler::SchedulerConfig,
) -> anyhow::Result<Started> {
    anyhow::bail!("this spindle was built without the CUDA backend")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_unknown_ones_are_errors() {
        assert_eq!("auto".parse::<Device>(), Ok(Device::Auto));
        assert_eq!("cpu".parse::<Device>(), Ok(Device::Cpu));
        assert_eq!("cuda".parse::<Device>(), Ok(Device::Cuda(0)));
        assert_eq!("cuda:3".parse::<Device>(), Ok(Device::Cuda(3)));
        for bad in ["gpu", "cuda:", "cuda:x", ""] {
            assert!(bad.parse::<Device>().unwrap_err().contains("is not a device"), "{bad}");
        }
    }

    #[test]
    fn auto_without_a_gpu_is_the_cpu_and_cuda_needs_the_backend() {
        if gpu_count() > 0 {
            println!("skipped: a GPU is present here");
            return;
        }
        assert!(matches!(resolve(Device::Auto), Ok(Device::Cpu)));
        if !cfg!(feature = "cuda") {
            let err = resolve(Device::Cuda(0)).unwrap_err().to_string();
            assert!(err.contains("built without the CUDA backend"), "{err}");
        }
    }
}
