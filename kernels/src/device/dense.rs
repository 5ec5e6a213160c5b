//! Launches of the dense kernels: the linear-layer GEMM (`cuda/gemm.cu`) and
//! RoPE from host-computed tables (`cuda/elementwise.cu`).

use super::{int, need, row_block, CudaError, Gpu};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg};
use half::bf16;

const TILE: usize = 64;

/// Rows up to which the skinny (decode) kernel is used.
pub const GEMV_MAX_M: usize = 8;
/// Linear layers one [`Gpu::gemv_jobs`] launch takes (`GEMV_MAX_JOBS` in gemm.cu).
pub const GEMV_MAX_JOBS: usize = 3;

/// One linear layer of a [`Gpu::gemv_jobs`] launch: `y = x · wᵀ`, `w` of
/// `n` rows.
pub type GemvJob<'a> = (&'a CudaSlice<bf16>, &'a mut CudaSlice<bf16>, usize);

/// `GemvJobs` of gemm.cu, passed by value: device pointers, rows, the
/// blocks each job owns.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct GemvJobs {
    y: [u64; GEMV_MAX_JOBS],
    w: [u64; GEMV_MAX_JOBS],
    n: [i32; GEMV_MAX_JOBS],
    rows_per_block: [i32; GEMV_MAX_JOBS],
    first_block: [i32; GEMV_MAX_JOBS + 1],
    jobs: i32,
}

// SAFETY: plain C data (integers and device addresses), laid out as the
// kernel's struct.
unsafe impl DeviceRepr for GemvJobs {}

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
    /// `y[m, n] = x[m, k] · w[n, k]ᵀ` with f32 accumulation: Spindle's skinny
    /// kernel for up to [`Self::gemv_rows`] rows (`k` a multiple of 8), else
    /// cuBLAS when it is loaded, else Spindle's kernels (up to 8 rows with
    /// `k` a multiple of 8, decode steps, take the skinny kernel that streams
    /// the weights in 16-byte loads; the rest the tiled tensor-core one).
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
            GemmKernel::Auto if m <= self.gemv_rows() && m <= GEMV_MAX_M && k.is_multiple_of(8) => GemmKernel::Spindle,
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
            let rows_per_block = gemv_rows_per_block(n, self.multiprocessors());
            let cfg = LaunchConfig { grid_dim: (int(n.div_ceil(rows_per_block))? as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            let rpb32 = int(rows_per_block)?;
            let mut launch = self.stream.launch_builder(f);
            launch.arg(y).arg(x).arg(w).arg(&m32).arg(&n32).arg(&k32).arg(&rpb32);
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

    /// Several linear layers that read the same `x` (`[m, k]`, m at most
    /// [`GEMV_MAX_M`], k a multiple of 8), as one launch of the skinny
    /// kernel: q, k and v, or gate and up, of a decode step.
    pub fn gemv_jobs(&self, x: &CudaSlice<bf16>, m: usize, k: usize, jobs: &mut [GemvJob<'_>]) -> Result<(), CudaError> {
        if jobs.is_empty() || m == 0 {
            return Ok(());
        }
        if jobs.len() > GEMV_MAX_JOBS {
            return Err(CudaError::Shape(format!("{} skinny jobs in one launch (at most {GEMV_MAX_JOBS})", jobs.len())));
        }
        if m > GEMV_MAX_M {
            return Err(CudaError::Shape(format!("{m} rows for the skinny kernel (at most {GEMV_MAX_M})")));
        }
        if k == 0 || !k.is_multiple_of(8) {
            return Err(CudaError::Shape(format!("k = {k} for the skinny kernel (a positive multiple of 8)")));
        }
        need(x, m * k, "x")?;
        let count = jobs.len();
        let mut desc = GemvJobs { jobs: int(count)?, ..GemvJobs::default() };
        let mut blocks = 0;
        let mut guards = Vec::with_capacity(2 * jobs.len());
        for (j, (w, y, n)) in jobs.iter_mut().enumerate() {
            need(w, *n * k, "w")?;
            need(y, m * *n, "y")?;
            let rows_per_block = gemv_rows_per_block(*n, self.multiprocessors());
            desc.n[j] = int(*n)?;
            desc.rows_per_block[j] = int(rows_per_block)?;
            desc.first_block[j] = int(blocks)?;
            blocks += n.div_ceil(rows_per_block);
            let (wp, w_sync) = w.device_ptr(&self.stream);
            let (yp, y_sync) = y.device_ptr_mut(&self.stream);
            desc.w[j] = wp;
            desc.y[j] = yp;
            guards.push(w_sync);
            guards.push(y_sync);
        }
        desc.first_block[count] = int(blocks)?;
        if blocks == 0 {
            return Ok(());
        }
        let (m32, k32) = (int(m)?, int(k)?);
        let f = self.function("gemv_jobs_bf16")?;
        let cfg = LaunchConfig { grid_dim: (int(blocks)? as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut launch = self.stream.launch_builder(f);
        launch.arg(&desc).arg(x).arg(&m32).arg(&k32);
        // SAFETY: every w holds n * k values and every y m * n (checked
        // above), x m * k; whole allocations are 256-byte aligned and rows of
        // k (a multiple of 8) keep the 16-byte loads aligned; the pointers
        // stay valid while the borrows (and their guards) live.
        unsafe { launch.launch(cfg) }?;
        drop(guards);
        Ok(())
    }

    /// Rows of x up to which [`GemmKernel::Auto`] runs Spindle's skinny
    /// kernel even with cuBLAS loaded (0: cuBLAS for every shape it takes).
    pub fn gemv_rows(&self) -> usize {
        self.gemv_rows.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets [`Self::gemv_rows`] (at most 8 take effect).
    pub fn set_gemv_rows(&self, rows: usize) {
        self.gemv_rows.store(rows, std::sync::atomic::Ordering::Relaxed);
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

/// Rows of w one block of the skinny kernel takes (8, 4, 2 or 1): fewer
/// when `n` is small, so there are at least four blocks per multiprocessor
/// (each row's k then splits over more warps).
fn gemv_rows_per_block(n: usize, multiprocessors: usize) -> usize {
    let mut rows = 8;
    while rows > 1 && n.div_ceil(rows) < 4 * multiprocessors {
        rows /= 2;
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::gemv_rows_per_block;

    #[test]
    fn narrow_layers_split_rows_over_more_warps() {
        // An H200 has 132 multiprocessors.
        assert_eq!(gemv_rows_per_block(128_256, 132), 8);
        assert_eq!(gemv_rows_per_block(14_336, 132), 8);
        assert_eq!(gemv_rows_per_block(4096, 132), 4);
        assert_eq!(gemv_rows_per_block(1024, 132), 1);
        assert_eq!(gemv_rows_per_block(1, 132), 1);
        assert_eq!(gemv_rows_per_block(4096, 1), 8);
    }
}
