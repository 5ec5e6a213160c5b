// Dense bf16 GEMM for linear layers, y[m, n] = x[m, k] · w[n, k]ᵀ, f32
// accumulation, with bf16 or f32 output. A plain shared-memory tiled kernel
// (64×64 tile per block of 256 threads, 4×4 outputs per thread, k in steps
// of 16): correct for every shape, not yet tuned (no tensor cores).
#include "common.cuh"

#define TILE 64
#define KSTEP 16

template <typename Out>
__device__ __forceinline__ void store(Out* y, size_t i, float v);
template <>
__device__ __forceinline__ void store<bf16>(bf16* y, size_t i, float v) { y[i] = to_bf16(v); }
template <>
__device__ __forceinline__ void store<float>(float* y, size_t i, float v) { y[i] = v; }

template <typename Out>
__device__ void gemm_tile(Out* __restrict__ y, const bf16* __restrict__ x, const bf16* __restrict__ w, int m, int n, int k) {
    __shared__ float xs[KSTEP][TILE + 1];
    __shared__ float ws[KSTEP][TILE + 1];
    const int row0 = blockIdx.y * TILE, col0 = blockIdx.x * TILE;
    const int tr = threadIdx.x / 16, tc = threadIdx.x % 16;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < k; k0 += KSTEP) {
        // 64 rows × 16 k of x and of w: 1024 values each, 4 per thread.
        for (int i = threadIdx.x; i < TILE * KSTEP; i += blockDim.x) {
            const int r = i / KSTEP, kk = i % KSTEP;
            const int gr = row0 + r, gc = col0 + r, gk = k0 + kk;
            xs[kk][r] = (gr < m && gk < k) ? to_f32(x[(size_t)gr * k + gk]) : 0.0f;
            ws[kk][r] = (gc < n && gk < k) ? to_f32(w[(size_t)gc * k + gk]) : 0.0f;
        }
        __syncthreads();
        for (int kk = 0; kk < KSTEP; ++kk) {
            float a[4], b[4];
            for (int i = 0; i < 4; ++i) a[i] = xs[kk][tr + 16 * i];
            for (int j = 0; j < 4; ++j) b[j] = ws[kk][tc + 16 * j];
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; ++i) {
        const int r = row0 + tr + 16 * i;
        if (r >= m) continue;
        for (int j = 0; j < 4; ++j) {
            const int c = col0 + tc + 16 * j;
            if (c < n) store<Out>(y, (size_t)r * n + c, acc[i][j]);
        }
    }
}

// Grid (ceil(n / 64), ceil(m / 64)), 256 threads.
extern "C" __global__ void gemm_bf16(bf16* y, const bf16* x, const bf16* w, int m, int n, int k) {
    gemm_tile<bf16>(y, x, w, m, n, k);
}

extern "C" __global__ void gemm_bf16_f32out(float* y, const bf16* x, const bf16* w, int m, int n, int k) {
    gemm_tile<float>(y, x, w, m, n, k);
}

// Skinny GEMM for decode (gemv_rows below): w is streamed once in 16-byte
// loads while m ≤ GEMV_MAX_M rows of x are summed against it.
#define GEMV_MAX_M 8

// Weight chunks (16 bytes each) every lane loads before using them.
#define GEMV_UNROLL 4

// Skinny GEMM y = x · wᵀ for m ≤ GEMV_MAX_M rows, k a multiple of 8: each
// block of 8 warps takes `rows_per_block` rows of w (1, 2, 4 or 8), each row
// split along k over 8 / rows_per_block warps, so a narrow layer still spreads
// over every multiprocessor. Each lane loads GEMV_UNROLL 16-byte weight
// chunks before using them (bytes in flight); the row's partial sums are
// added in a fixed order (the result does not depend on timing).
template <typename Out>
__device__ void gemv_rows(Out* __restrict__ y, const bf16* __restrict__ x, const bf16* __restrict__ w, int m, int n,
                          int k, int rows_per_block, int block) {
    __shared__ float partial[8][GEMV_MAX_M];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int warps_per_row = (blockDim.x >> 5) / rows_per_block;
    const int row = block * rows_per_block + warp / warps_per_row;
    const int part = warp % warps_per_row;
    const int chunks = k >> 3;
    const int stride = warps_per_row * 32;
    // Fixed-size loops over GEMV_MAX_M (guarded by m) keep acc in registers.
    float acc[GEMV_MAX_M];
#pragma unroll
    for (int r = 0; r < GEMV_MAX_M; ++r) acc[r] = 0.0f;
    if (row < n) {
        const uint4* wr = reinterpret_cast<const uint4*>(w + (size_t)row * k);
        for (int c0 = part * 32 + lane; c0 < chunks; c0 += stride * GEMV_UNROLL) {
            uint4 packed[GEMV_UNROLL];
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; ++u) {
                const int c = c0 + u * stride;
                packed[u] = c < chunks ? wr[c] : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; ++u) {
                const int c = c0 + u * stride;
                if (c >= chunks) break;
                const bf16* wv = reinterpret_cast<const bf16*>(&packed[u]);
                float wf[8];
#pragma unroll
                for (int j = 0; j < 8; ++j) wf[j] = to_f32(wv[j]);
#pragma unroll
                for (int r = 0; r < GEMV_MAX_M; ++r) {
                    if (r < m) {
                        const uint4 xp = reinterpret_cast<const uint4*>(x + (size_t)r * k)[c];
                        const bf16* xv = reinterpret_cast<const bf16*>(&xp);
                        float s = 0.0f;
#pragma unroll
                        for (int j = 0; j < 8; ++j) s += wf[j] * to_f32(xv[j]);
                        acc[r] += s;
                    }
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < GEMV_MAX_M; ++r) {
        if (r < m) {
            const float total = warp_sum(acc[r]);
            if (lane == 0) partial[warp][r] = total;
        }
    }
    __syncthreads();
    if (part == 0 && row < n && lane < m) {
        float total = 0.0f;
        for (int p = 0; p < warps_per_row; ++p) total += partial[warp + p][lane];
        store<Out>(y, (size_t)lane * n + row, total);
    }
}

// Grid ceil(n / rows_per_block), 256 threads.
extern "C" __global__ void gemv_bf16(bf16* y, const bf16* x, const bf16* w, int m, int n, int k, int rows_per_block) {
    gemv_rows<bf16>(y, x, w, m, n, k, rows_per_block, blockIdx.x);
}

extern "C" __global__ void gemv_bf16_f32out(float* y, const bf16* x, const bf16* w, int m, int n, int k,
                                            int rows_per_block) {
    gemv_rows<float>(y, x, w, m, n, k, rows_per_block, blockIdx.x);
}

// Linear layers that all read the same x (q, k and v; gate and up), as one
// launch of the skinny kernel: job j owns blocks [first_block[j],
// first_block[j + 1]). Passed by value (the layout of GemvJobs in dense.rs).
#define GEMV_MAX_JOBS 3
struct GemvJobs {
    bf16* y[GEMV_MAX_JOBS];
    const bf16* w[GEMV_MAX_JOBS];
    int n[GEMV_MAX_JOBS];
    int rows_per_block[GEMV_MAX_JOBS];
    int first_block[GEMV_MAX_JOBS + 1];
    int jobs;
};

// Grid first_block[jobs], 256 threads.
extern "C" __global__ void gemv_jobs_bf16(const GemvJobs jobs, const bf16* x, int m, int k) {
    // Constant indices only (a run-time index would copy the struct to local memory).
    bf16* y = jobs.y[0];
    const bf16* w = jobs.w[0];
    int n = jobs.n[0], rows_per_block = jobs.rows_per_block[0], first = 0;
#pragma unroll
    for (int j = 1; j < GEMV_MAX_JOBS; ++j) {
        if (j < jobs.jobs && (int)blockIdx.x >= jobs.first_block[j]) {
            y = jobs.y[j];
            w = jobs.w[j];
            n = jobs.n[j];
            rows_per_block = jobs.rows_per_block[j];
            first = jobs.first_block[j];
        }
    }
    gemv_rows<bf16>(y, x, w, m, n, k, rows_per_block, blockIdx.x - first);
}

// Tensor-core GEMM (WMMA, bf16 in, f32 accumulate), y = x · wᵀ for any m, n,
// k: 128 threads (4 warps) per 64×64 output tile, each warp a 32×32 corner
// (2×2 fragments of 16×16); k in steps of 32 through shared memory, tiles
// zero-padded at the edges.
#include <mma.h>
#define TC_TILE 64
#define TC_K 32

template <typename Out>
__device__ void gemm_tc_tile(Out* __restrict__ y, const bf16* __restrict__ x, const bf16* __restrict__ w, int m, int n, int k) {
    using namespace nvcuda;
    __shared__ __align__(32) bf16 xs[TC_TILE][TC_K + 8];
    __shared__ __align__(32) bf16 ws[TC_TILE][TC_K + 8];
    __shared__ __align__(32) float cs[TC_TILE][TC_TILE + 4];
    const int row0 = blockIdx.y * TC_TILE, col0 = blockIdx.x * TC_TILE;
    const int warp = threadIdx.x >> 5;
    const int wr = (warp >> 1) * 32, wc = (warp & 1) * 32;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
    const bf16 zero = to_bf16(0.0f);
    for (int k0 = 0; k0 < k; k0 += TC_K) {
        for (int i = threadIdx.x; i < TC_TILE * TC_K; i += blockDim.x) {
            const int r = i / TC_K, kk = i % TC_K, gk = k0 + kk;
            xs[r][kk] = (row0 + r < m && gk < k) ? x[(size_t)(row0 + r) * k + gk] : zero;
            ws[r][kk] = (col0 + r < n && gk < k) ? w[(size_t)(col0 + r) * k + gk] : zero;
        }
        __syncthreads();
        for (int kk = 0; kk < TC_K; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b[2];
            for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], &xs[wr + 16 * i][kk], TC_K + 8);
            // w's rows are y's columns: column-major B with leading dimension TC_K + 8.
            for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b[j], &ws[wc + 16 * j][kk], TC_K + 8);
            for (int i = 0; i < 2; ++i)
                for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(&cs[wr + 16 * i][wc + 16 * j], acc[i][j], TC_TILE + 4, wmma::mem_row_major);
    __syncthreads();
    for (int i = threadIdx.x; i < TC_TILE * TC_TILE; i += blockDim.x) {
        const int r = i / TC_TILE, c = i % TC_TILE;
        if (row0 + r < m && col0 + c < n) store<Out>(y, (size_t)(row0 + r) * n + col0 + c, cs[r][c]);
    }
}

// Grid (ceil(n / 64), ceil(m / 64)), 128 threads.
extern "C" __global__ void gemm_tc_bf16(bf16* y, const bf16* x, const bf16* w, int m, int n, int k) {
    gemm_tc_tile<bf16>(y, x, w, m, n, k);
}

extern "C" __global__ void gemm_tc_bf16_f32out(float* y, const bf16* x, const bf16* w, int m, int n, int k) {
    gemm_tc_tile<float>(y, x, w, m, n, k);
}
