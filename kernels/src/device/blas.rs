//! cuBLAS for the linear layers: `cublasGemmEx` in bf16 with f32 accumulate,
//! loaded at run time like the driver. Where `libcublas.so` cannot be found
//! (or the handle cannot be made), [`Gpu`](super::Gpu) keeps Spindle's own
//! GEMM kernels and says why in [`Blas::unavailable`].

use super::{int, CudaError};
use cudarc::cublas::{result::gemm_ex, sys, CudaBlas};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;
use std::sync::Arc;

/// cuBLAS on one stream, or why it is not there.
#[derive(Debug)]
pub(crate) struct Blas {
    handle: Option<CudaBlas>,
    /// The handle's workspace (it must outlive the handle's use).
    #[allow(dead_code)]
    workspace: Option<CudaSlice<u8>>,
    stream: Arc<CudaStream>,
    /// Why cuBLAS is not used (`None` when it is).
    pub(crate) unavailable: Option<String>,
}

/// Whether `libcublas` can be loaded (never panics).
pub fn cublas_present() -> bool {
    // SAFETY: only tries to dlopen the library; nothing is called in it.
    unsafe { sys::is_culib_present() }
}

/// cuBLAS's workspace, set up front so that GEMMs can be captured into a
/// CUDA graph (cuBLAS may not allocate during capture); 32 MiB as NVIDIA
/// recommends for Hopper.
const WORKSPACE_BYTES: usize = 32 << 20;

impl Blas {
    /// A handle on `stream` (unless `enabled` is false), or the reason there is none.
    pub(crate) fn open(stream: &Arc<CudaStream>, enabled: bool) -> Self {
        let off = |why: String| Self { handle: None, workspace: None, stream: stream.clone(), unavailable: Some(why) };
        if !enabled {
            return off("turned off (--no-cublas)".into());
        }
        if !cublas_present() {
            return off("no libcublas.so (13, or an older major) on the library path".into());
        }
        let handle = match CudaBlas::new(stream.clone()) {
            Ok(handle) => handle,
            Err(e) => return off(format!("cublasCreate failed: {e}")),
        };
        let workspace = match stream.alloc_zeros::<u8>(WORKSPACE_BYTES) {
            Ok(w) => w,
            Err(e) => return off(format!("no memory for its workspace: {e}")),
        };
        let status = {
            let (ptr, _sync) = workspace.device_ptr(stream);
            // SAFETY: a live device buffer of WORKSPACE_BYTES, kept as long as the handle.
            unsafe { sys::cublasSetWorkspace_v2(*handle.handle(), ptr as *mut _, WORKSPACE_BYTES) }
        };
        if status != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return off(format!("cublasSetWorkspace failed: {status:?}"));
        }
        Self { handle: Some(handle), workspace: Some(workspace), stream: stream.clone(), unavailable: None }
    }

    /// Whether cuBLAS runs the GEMMs.
    pub(crate) fn loaded(&self) -> bool {
        self.handle.is_some()
    }

    /// `y[m, n] = x[m, k] · w[n, k]ᵀ`, f32 accumulation, `y` in `out_type`.
    /// Row-major `y` is the column-major n×m product `wᵀ(k×n)ᵀ · x(k×m)`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        out_type: sys::cudaDataType,
        y: &mut CudaSlice<T>,
        x: &CudaSlice<bf16>,
        w: &CudaSlice<bf16>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        let Some(blas) = &self.handle else {
            return Err(CudaError::Blas(
                self.unavailable.clone().unwrap_or_default(),
            ));
        };
        let stream = &self.stream;
        if k == 0 {
            // cuBLAS refuses a zero leading dimension; the product is zero.
            stream.memset_zeros(y)?;
            return Ok(());
        }
        let (m32, n32, k32) = (int(m)?, int(n)?, int(k)?);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (xp, _x_sync) = x.device_ptr(stream);
        let (wp, _w_sync) = w.device_ptr(stream);
        let (yp, _y_sync) = y.device_ptr_mut(stream);
        // SAFETY: the pointers are live device buffers of at least n·k, m·k
        // and m·n values (checked by the caller), on the handle's stream; the
        // leading dimensions are the rows' lengths.
        unsafe {
            gemm_ex(
                *blas.handle(),
                sys::cublasOperation_t::CUBLAS_OP_T,
                sys::cublasOperation_t::CUBLAS_OP_N,
                n32,
                m32,
                k32,
                (&alpha as *const f32).cast(),
                wp as *const _,
                sys::cudaDataType_t::CUDA_R_16BF,
                k32,
                xp as *const _,
                sys::cudaDataType_t::CUDA_R_16BF,
                k32,
                (&beta as *const f32).cast(),
                yp as *mut _,
                out_type,
                n32,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| CudaError::Blas(format!("cublasGemmEx: {e}")))
    }
}
