//! CUDA kernels for Spindle.
//!
//! With the `cuda` feature off (the default) this crate is empty, so the whole
//! workspace builds on machines without a CUDA toolkit. The CUDA backend issue
//! adds the `.cu` sources, the nvcc build script and typed launchers here.
