//! Launches of the dense kernels: the linear-layer GEMM (`cuda/gemm.cu`) and
//! RoPE from host-computed tables (`cuda/elementwise.cu`).

use super::{int, need, row_block, CudaError, Gpu};
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};
use half::bf16;

const TILE: usize = 64;

/// Rows up to which the skinny (decode) kernel is used.
const GEMV_MAX_M: usize = 8;

/// Output element types of [`Gpu::gemm`].
pub trait GemmOut: DeviceRepr + cudarc::driver::ValidAsZeroBits {
    /// The tiled CUDA-core kernel writing this type.
    const KERNEL: &'static str;
    /// The tiled tensor-core kernel writing this type.
    const TENSOR_CORE: &'static str;
    /// The skinny kernel writing this type.
    const GEMV: &'static str;
    /// cuBLAS's name for this type.
    const CUBLAS: cudarc::cublas::sys::cudaDataType;
}

impl GemmOut for bf16 {
    const KERNEL: &'static str = "gemm_bf16";
    const TENSOR_CORE: &'static str = "gemm_tc_bf16";
    const GEMV: &'static str = "gemv_bf16";
    const CUBLAS: cudarc::cublas::sys::cudaDataType = cudarc::cublas::sys::cudaDataType::CUDA_R_16BF;
}

impl GemmOut for f32 {
    const KERNEL: &'static str = "gemm_bf16_f32out";
    const TENSOR_CORE: &'static str = "gemm_tc_bf16_f32out";
    const GEMV: &'static str = "gemv_bf16_f32out";
    const CUBLAS: cudarc::cublas::sys::cudaDataType = cudarc::cublas::sys::cudaDataType::CUDA_R_32F;
}

/// Which GEMM kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmKernel {
    /// cuBLAS when it is loaded; else [`Self::Spindle`].
    Auto,
    /// Spindle's own by shape: the skinny kernel for up to 8 rows (k a
    /// multiple of 8), else tensor cores.
    Spindle,
    /// cuBLAS (`cublasGemmEx`, bf16 in, f32 accumulate); an error when not loaded.
    Cublas,
    /// The tiled CUDA-core kernel (the reference the others are tested against).
    Simt,
    /// The tiled tensor-core (WMMA) kernel.
    TensorCore,
}

impl Gpu {
    /// `y[m, n] = x[m, k] · w[n, k]ᵀ` with f32 accumulation: cuBLAS when it
    /// is loaded, else Spindle's kernels (up to 8 rows with `k` a multiple of
    /// 8, decode steps, take the skinny kernel that streams the weights in
    /// 16-byte loads; the rest the tiled tensor-core one).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm<T: GemmOut>(&self, y: &mut CudaSlice<T>, x: &CudaSlice<bf16>, w: &CudaSlice<bf16>, m: usize, n: usize, k: usize) -> Result<(), CudaError> {
        self.gemm_with(GemmKernel::Auto, y, x, w, m, n, k)
    }

    /// [`Self::gemm`] with the kernel chosen (to test each against the others).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_with<T: GemmOut>(&self, kernel: GemmKernel, y: &mut CudaSlice<T>, x: &CudaSlice<bf16>, w: &CudaSlice<bf16>, m: usize, n: usize, k: usize) -> Result<(), CudaError> {
        if m == 0 || n == 0 {
            return Ok(());
        }
        need(y, m * n, "y")?;
        need(x, m * k, "x")?;
        need(w, n * k, "w")?;
        let kernel = match kernel {
            GemmKernel::Auto if self.blas.loaded() => GemmKernel::Cublas,
            GemmKernel::Auto => GemmKernel::Spindle,
            other => other,
        };
        if kernel == GemmKernel::Cublas {
            return self.blas.gemm(T::CUBLAS, y, x, w, m, n, k);
        }
        let (m32, n32, k32) = (int(m)?, int(n)?, int(k)?);
        if kernel == GemmKernel::Spindle && m <= GEMV_MAX_M && k > 0 && k.is_multiple_of(8) {
            let f = self.function(T::GEMV)?;
            let cfg = LaunchConfig { grid_dim: (int(n.div_ceil(8))? as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            let mut launch = self.stream.launch_builder(f);
            launch.arg(y).arg(x).arg(w).arg(&m32).arg(&n32).arg(&k32);
            // SAFETY: as below; whole allocations are 256-byte aligned and rows
            // of k (a multiple of 8) bf16 keep the 16-byte loads aligned.
            unsafe { launch.launch(cfg) }?;
            return Ok(());
        }
        let grid = (n.div_ceil(TILE) as u32, m.div_ceil(TILE) as u32, 1);
        if grid.1 > 65_535 {
            return Err(CudaError::TooLarge(m));
        }
        let (f, threads) = match kernel {
            GemmKernel::Simt => (self.function(T::KERNEL)?, 256),
            _ => (self.function(T::TENSOR_CORE)?, 128),
        };
        let cfg = LaunchConfig { grid_dim: grid, block_dim: (threads, 1, 1), shared_mem_bytes: 0 };
        let mut launch = self.stream.launch_builder(f);
        launch.arg(y).arg(x).arg(w).arg(&m32).arg(&n32).arg(&k32);
        // SAFETY: y holds m * n values, x m * k, w n * k (the caller's contract).
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }

    /// RoPE in place on `x` = [tokens, heads, head_dim] with `cos`/`sin` =
    /// [tokens, head_dim / 2]; `interleaved` pairs (2i, 2i+1), else halves.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_table(&self, x: &mut CudaSlice<bf16>, cos: &CudaSlice<f32>, sin: &CudaSlice<f32>, tokens: usize, heads: usize, head_dim: usize, interleaved: bool) -> Result<(), CudaError> {
        let f = self.function("rope_table_bf16")?;
        if tokens == 0 || heads == 0 || head_dim < 2 {
            return Ok(());
        }
        need(x, tokens * heads * head_dim, "x")?;
        need(cos, tokens * (head_dim / 2), "cos")?;
        need(sin, tokens * (head_dim / 2), "sin")?;
        let (heads32, dim32, style) = (int(heads)?, int(head_dim)?, i32::from(interleaved));
        let cfg = LaunchConfig { grid_dim: (int(tokens * heads)? as u32, 1, 1), block_dim: (row_block(head_dim / 2), 1, 1), shared_mem_bytes: 0 };
        let mut launch = self.stream.launch_builder(f);
        launch.arg(x).arg(cos).arg(sin).arg(&heads32).arg(&dim32).arg(&style);
        // SAFETY: x holds tokens * heads * head_dim values, cos/sin tokens * head_dim / 2.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }
}
