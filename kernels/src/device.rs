//! The kernels on a CUDA device (feature `cuda`): a context on one GPU with
//! the embedded cubins loaded, and a typed launch for each kernel. The
//! driver is loaded at run time; without one, [`Gpu::open`] returns
//! [`CudaError::NoDriver`] instead of panicking (cudarc would panic).

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DriverError, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use half::bf16;
use std::collections::HashMap;
use std::sync::Arc;

mod attention;
mod blas;
mod dense;
mod prefill;
mod sample;
pub use attention::{DecodeKernel, DecodeScratch, DecodeShape, DECODE_PARTITION, MAX_DECODE_GROUP, MAX_HEAD_DIM};
pub use blas::cublas_present;
pub use dense::{GemmKernel, GemmOut, GemvJob, GEMV_MAX_JOBS, GEMV_MAX_M};
pub use prefill::{PrefillShape, PREFILL_MAX_HEAD_DIM, PREFILL_TILE};
pub use sample::{RowSample, RowSampling};

/// Why the GPU cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// libcuda.so could not be loaded.
    #[error("no CUDA driver: libcuda.so could not be loaded (no NVIDIA GPU or driver on this machine)")]
    NoDriver,
    /// The ordinal is past the devices present.
    #[error("no CUDA device {asked}: {present} present")]
    NoDevice {
        /// The ordinal asked for.
        asked: usize,
        /// How many devices the driver reports.
        present: i32,
    },
    /// A driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(#[from] DriverError),
    /// A kernel is not in the embedded modules.
    #[error("kernel `{0}` is not embedded")]
    MissingKernel(&'static str),
    /// Sizes that do not fit the kernel's integer arguments.
    #[error("size {0} is too large for this kernel")]
    TooLarge(usize),
    /// A module could not be loaded.
    #[error("loading kernels: {0}")]
    Load(String),
    /// The GPU is too old for the kernels.
    #[error("unsupported GPU: {0}")]
    Unsupported(String),
    /// cuBLAS is not loaded, or a cuBLAS call failed.
    #[error("cuBLAS: {0}")]
    Blas(String),
    /// A geometry the kernel does not take.
    #[error("unsupported shape: {0}")]
    Shape(String),
}

/// Whether the CUDA driver library can be loaded (never panics).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen libcuda; no driver call is made.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// [`Gpu::gemv_rows`] of a newly opened GPU.
pub const DEFAULT_GEMV_ROWS: usize = 0;

/// One GPU with Spindle's kernels loaded.
#[derive(Debug)]
pub struct Gpu {
    /// The device context.
    pub ctx: Arc<CudaContext>,
    /// The stream kernels are launched on.
    pub stream: Arc<CudaStream>,
    functions: HashMap<&'static str, CudaFunction>,
    blas: blas::Blas,
    /// See [`Gpu::gemv_rows`].
    gemv_rows: std::sync::atomic::AtomicUsize,
    multiprocessors: usize,
    /// Page-locked host memory reused by [`Gpu::read_host`].
    host_staging: std::sync::Mutex<Option<cudarc::driver::PinnedHostSlice<f32>>>,
}

/// Most values [`Gpu::read_host`] stages in page-locked memory (1 GiB);
/// larger copies go to pageable memory.
const HOST_STAGING_MAX: usize = 256 << 20;

/// `buf` must hold at least `n` values.
fn need<T>(buf: &CudaSlice<T>, n: usize, what: &str) -> Result<(), CudaError> {
    if buf.len() < n {
        return Err(CudaError::Shape(format!("{what} holds {} values, the launch needs {n}", buf.len())));
    }
    Ok(())
}

fn int(n: usize) -> Result<i32, CudaError> {
    i32::try_from(n).map_err(|_| CudaError::TooLarge(n))
}

/// A grid-stride launch over `n` values: 256 threads a block, at most 65 535 blocks.
fn elementwise_launch(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 65_535) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

/// Threads per block for a row of `n` values (a multiple of 32, 32..=1024).
fn row_block(n: usize) -> u32 {
    (n.clamp(1, 1024).div_ceil(32) * 32) as u32
}

impl Gpu {
    /// Opens device `ordinal` and loads the embedded kernels (GEMMs on
    /// cuBLAS when it loads).
    pub fn open(ordinal: usize) -> Result<Self, CudaError> {
        Self::open_with(ordinal, true)
    }

    /// [`Self::open`], with cuBLAS used for GEMMs only if `cublas` (else
    /// Spindle's own GEMM kernels run them).
    pub fn open_with(ordinal: usize, cublas: bool) -> Result<Self, CudaError> {
        if !driver_present() {
            return Err(CudaError::NoDriver);
        }
        let present = CudaContext::device_count()?;
        if i32::try_from(ordinal).map_or(true, |o| o >= present) {
            return Err(CudaError::NoDevice { asked: ordinal, present });
        }
        let ctx = CudaContext::new(ordinal)?;
        let (major, minor) = ctx.compute_capability()?;
        if major < 9 {
            return Err(CudaError::Unsupported(format!("{} is compute capability {major}.{minor}; the kernels need 9.0 or newer (Hopper)", ctx.name()?)));
        }
        // One stream of our own (the legacy default stream cannot be
        // captured into a CUDA graph), and no per-buffer events: every
        // launch and copy is ordered on this one stream.
        // SAFETY: called before any buffer exists in this context.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let mut functions = HashMap::new();
        for m in crate::MODULES {
            // The sm_90a SASS; on other GPUs the driver JITs the PTX.
            let module = match ctx.load_module(Ptx::from_binary(m.cubin.to_vec())) {
                Ok(module) => module,
                Err(cubin) => ctx
                    .load_module(Ptx::from_src(m.ptx))
                    .map_err(|ptx| CudaError::Load(format!("{}: the sm_90a cubin failed ({cubin}) and so did the PTX ({ptx})", m.name)))?,
            };
            for &f in m.functions {
                functions.insert(f, module.load_function(f)?);
            }
        }
        let blas = blas::Blas::open(&stream, cublas);
        let multiprocessors = ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let multiprocessors = usize::try_from(multiprocessors).unwrap_or(1).max(1);
        Ok(Self {
            ctx,
            stream,
            functions,
            blas,
            gemv_rows: std::sync::atomic::AtomicUsize::new(DEFAULT_GEMV_ROWS),
            multiprocessors,
            host_staging: std::sync::Mutex::new(None),
        })
    }

    /// `f` over the first `n` values of `src`, copied to the host through
    /// page-locked memory kept for the next call (a pageable destination
    /// makes the driver stage the copy, and a fresh one page-faults); copies
    /// of more than 1 GiB go through pageable memory. The staging buffer
    /// only grows (to the largest copy so far, at most 1 GiB).
    pub fn read_host<R>(&self, src: &CudaSlice<f32>, n: usize, f: impl FnOnce(&[f32]) -> R) -> Result<R, CudaError> {
        need(src, n, "src")?;
        if n == 0 {
            return Ok(f(&[]));
        }
        if n > HOST_STAGING_MAX {
            return Ok(f(&self.stream.clone_dtoh(&src.slice(..n))?));
        }
        let mut staging = self.host_staging.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if staging.as_ref().is_none_or(|s| s.len() < n) {
            *staging = None;
            // Whole MiB of values, so a slowly growing batch does not reallocate every step.
            let len = n.div_ceil(1 << 18) * (1 << 18);
            // SAFETY: freshly allocated page-locked memory of len values,
            // zeroed through its pointer before any slice of it is made.
            // Flags 0: cached (not write-combined) memory, which the host
            // reads quickly.
            let mut fresh = unsafe { self.ctx.alloc_pinned_with_flags::<f32>(len, 0) }?;
            unsafe { std::ptr::write_bytes(fresh.as_mut_ptr()?, 0, len) };
            *staging = Some(fresh);
        }
        let Some(pinned) = staging.as_mut() else { unreachable!("allocated above") };
        let dst = &mut pinned.as_mut_slice()?[..n];
        self.ctx.bind_to_thread()?;
        let (src_ptr, _sync) = src.device_ptr(&self.stream);
        // SAFETY: dst is n page-locked values and src holds at least n; the
        // stream is synchronized before dst is read.
        unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, src_ptr, self.stream.cu_stream()) }?;
        self.stream.synchronize()?;
        Ok(f(dst))
    }

    /// Streaming multiprocessors on the device.
    pub fn multiprocessors(&self) -> usize {
        self.multiprocessors
    }

    /// The device's name.
    pub fn name(&self) -> Result<String, CudaError> {
        Ok(self.ctx.name()?)
    }

    /// The device's UUID as NVML writes it (`GPU-xxxxxxxx-xxxx-…`), which
    /// names it whatever `CUDA_VISIBLE_DEVICES` renumbered.
    pub fn uuid(&self) -> Result<String, CudaError> {
        let raw = self.ctx.uuid()?;
        let b: Vec<u8> = raw.bytes.iter().map(|&c| c as u8).collect();
        let hex = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
        Ok(format!("GPU-{}-{}-{}-{}-{}", hex(0..4), hex(4..6), hex(6..8), hex(8..10), hex(10..16)))
    }

    /// What runs the linear layers: `cuBLAS`, or Spindle's kernels and why
    /// cuBLAS is not used.
    pub fn gemm_backend(&self) -> String {
        match &self.blas.unavailable {
            None => "cuBLAS (bf16, f32 accumulate)".into(),
            Some(why) => format!("Spindle's GEMM kernels (cuBLAS not used: {why})"),
        }
    }

    /// Whether cuBLAS is loaded (else [`GemmKernel::Cublas`] is an error).
    pub fn has_cublas(&self) -> bool {
        self.blas.loaded()
    }

    fn function(&self, name: &'static str) -> Result<&CudaFunction, CudaError> {
        self.functions.get(name).ok_or(CudaError::MissingKernel(name))
    }

    /// `out = rmsnorm(x) * weight` over `rows` rows of `n`; with `residual`,
    /// first `residual += x` (stored as bf16) and normalize that.
    #[allow(clippy::too_many_arguments)]
    pub fn add_rmsnorm(
        &self,
        out: &mut CudaSlice<bf16>,
        residual: Option<&mut CudaSlice<bf16>>,
        x: &CudaSlice<bf16>,
        weight: &CudaSlice<bf16>,
        rows: usize,
        n: usize,
        eps: f32,
    ) -> Result<(), CudaError> {
        let f = self.function("add_rmsnorm_bf16")?;
        if rows == 0 || n == 0 {
            return Ok(());
        }
        need(out, rows * n, "out")?;
        need(x, rows * n, "x")?;
        need(weight, n, "weight")?;
        if let Some(r) = &residual {
            need(r, rows * n, "residual")?;
        }
        let (n32, null) = (int(n)?, 0u64);
        let cfg = LaunchConfig { grid_dim: (int(rows)? as u32, 1, 1), block_dim: (row_block(n), 1, 1), shared_mem_bytes: 0 };
        let mut launch = self.stream.launch_builder(f);
        launch.arg(out);
        match residual {
            Some(r) => launch.arg(r),
            None => launch.arg(&null),
        };
        launch.arg(x).arg(weight).arg(&n32).arg(&eps);
        // SAFETY: the argument list matches the kernel's signature, and every
        // buffer holds rows * n values (the caller's contract).
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }

    /// `out[i] = silu(gate[i]) * up[i]` for `n` values.
    pub fn silu_mul(&self, out: &mut CudaSlice<bf16>, gate: &CudaSlice<bf16>, up: &CudaSlice<bf16>, n: usize) -> Result<(), CudaError> {
        self.gated("silu_mul_bf16", out, gate, up, n)
    }

    /// `out[i] = act(gate[i]) * up[i]` for `n` values by the kernel `name`.
    fn gated(&self, name: &'static str, out: &mut CudaSlice<bf16>, gate: &CudaSlice<bf16>, up: &CudaSlice<bf16>, n: usize) -> Result<(), CudaError> {
        let f = self.function(name)?;
        if n == 0 {
            return Ok(());
        }
        need(out, n, "out")?;
        need(gate, n, "gate")?;
        need(up, n, "up")?;
        let n64 = i64::try_from(n).map_err(|_| CudaError::TooLarge(n))?;
        let mut launch = self.stream.launch_builder(f);
        launch.arg(out).arg(gate).arg(up).arg(&n64);
        // SAFETY: as in add_rmsnorm; all three buffers hold n values.
        unsafe { launch.launch(elementwise_launch(n)) }?;
        Ok(())
    }

    /// `out[i] = gelu_tanh(gate[i]) * up[i]` for `n` values (Gemma's MLP).
    pub fn gelu_tanh_mul(&self, out: &mut CudaSlice<bf16>, gate: &CudaSlice<bf16>, up: &CudaSlice<bf16>, n: usize) -> Result<(), CudaError> {
        self.gated("gelu_tanh_mul_bf16", out, gate, up, n)
    }

    /// `x[i] *= factor` for `n` values.
    pub fn scale(&self, x: &mut CudaSlice<bf16>, factor: f32, n: usize) -> Result<(), CudaError> {
        let f = self.function("scale_bf16")?;
        if n == 0 {
            return Ok(());
        }
        need(x, n, "x")?;
        let n64 = i64::try_from(n).map_err(|_| CudaError::TooLarge(n))?;
        let mut launch = self.stream.launch_builder(f);
        launch.arg(x).arg(&factor).arg(&n64);
        // SAFETY: x holds n values; the argument list matches the kernel.
        unsafe { launch.launch(elementwise_launch(n)) }?;
        Ok(())
    }

    /// `y[r, c] += bias[c]` over `rows` rows of `n` values.
    pub fn add_bias(&self, y: &mut CudaSlice<bf16>, bias: &CudaSlice<bf16>, rows: usize, n: usize) -> Result<(), CudaError> {
        let f = self.function("add_bias_bf16")?;
        if rows == 0 || n == 0 {
            return Ok(());
        }
        need(y, rows * n, "y")?;
        need(bias, n, "bias")?;
        let rows64 = i64::try_from(rows).map_err(|_| CudaError::TooLarge(rows))?;
        let n32 = int(n)?;
        let blocks = (rows * n).div_ceil(256).clamp(1, 65_535) as u32;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut launch = self.stream.launch_builder(f);
        launch.arg(y).arg(bias).arg(&rows64).arg(&n32);
        // SAFETY: y holds rows * n values and bias n (checked above); the
        // argument list matches the kernel's signature.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }

    /// `out[r] = table[ids[r]]` for `rows` ids, rows of `dim` (ids ≥ `vocab` give zeros).
    pub fn embedding(&self, out: &mut CudaSlice<bf16>, table: &CudaSlice<bf16>, ids: &CudaSlice<u32>, rows: usize, dim: usize, vocab: u32) -> Result<(), CudaError> {
        let f = self.function("embedding_bf16")?;
        if rows == 0 || dim == 0 {
            return Ok(());
        }
        need(out, rows * dim, "out")?;
        need(ids, rows, "ids")?;
        need(table, vocab as usize * dim, "table")?;
        let dim32 = int(dim)?;
        let cfg = LaunchConfig { grid_dim: (int(rows)? as u32, 1, 1), block_dim: (row_block(dim), 1, 1), shared_mem_bytes: 0 };
        let mut launch = self.stream.launch_builder(f);
        launch.arg(out).arg(table).arg(ids).arg(&dim32).arg(&vocab);
        // SAFETY: out holds rows * dim values, table vocab * dim, ids rows.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }

    /// Rotary embedding in place on `x` = [tokens, heads, head_dim] (rotate-half layout).
    pub fn rope_neox(&self, x: &mut CudaSlice<bf16>, positions: &CudaSlice<i32>, tokens: usize, heads: usize, head_dim: usize, theta: f32) -> Result<(), CudaError> {
        let f = self.function("rope_neox_bf16")?;
        if tokens == 0 || heads == 0 || head_dim < 2 {
            return Ok(());
        }
        need(x, tokens * heads * head_dim, "x")?;
        need(positions, tokens, "positions")?;
        let (heads32, dim32) = (int(heads)?, int(head_dim)?);
        let cfg = LaunchConfig { grid_dim: (int(tokens * heads)? as u32, 1, 1), block_dim: (row_block(head_dim / 2), 1, 1), shared_mem_bytes: 0 };
        let mut launch = self.stream.launch_builder(f);
        launch.arg(x).arg(positions).arg(&heads32).arg(&dim32).arg(&theta);
        // SAFETY: x holds tokens * heads * head_dim values, positions tokens.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }
}
