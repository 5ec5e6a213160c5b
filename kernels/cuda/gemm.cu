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

// Skinny GEMM for decode, y[m, n] = x[m, k] · w[n, k]ᵀ with m ≤ GEMV_MAX_M
// and k a multiple of 8: one warp per output column n streams w's row in
// 16-byte loads (8 bf16) and keeps m partial sums, so the weights are read
// once at full bandwidth. 256 threads (8 warps) per block.
#define GEMV_MAX_M 8

template <typename Out>
__device__ void gemv_rows(Out* __restrict__ y, const bf16* __restrict__ x, const bf16* __restrict__ w, int m, int n, int k) {
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (warp >= n) return;
    const uint4* wr = reinterpret_cast<const uint4*>(w + (size_t)warp * k);
    float acc[GEMV_MAX_M];
    for (int r = 0; r < GEMV_MAX_M; ++r) acc[r] = 0.0f;
    const int chunks = k / 8;
    for (int c = lane; c < chunks; c += 32) {
        const uint4 packed = wr[c];
        const bf16* wv = reinterpret_cast<const bf16*>(&packed);
        float wf[8];
        for (int j = 0; j < 8; ++j) wf[j] = to_f32(wv[j]);
        for (int r = 0; r < m; ++r) {
            const uint4 xp = reinterpret_cast<const uint4*>(x + (size_t)r * k)[c];
            const bf16* xv = reinterpret_cast<const bf16*>(&xp);
            float s = 0.0f;
            for (int j = 0; j < 8; ++j) s += wf[j] * to_f32(xv[j]);
            acc[r] += s;
        }
    }
    for (int r = 0; r < m; ++r) {
        const float total = warp_sum(acc[r]);
        if (lane == 0) store<Out>(y, (size_t)r * n + warp, total);
    }
}

// Grid ceil(n / 8), 256 threads.
extern "C" __global__ void gemv_bf16(bf16* y, const bf16* x, const bf16* w, int m, int n, int k) {
    gemv_rows<bf16>(y, x, w, m, n, k);
}

extern "C" __global__ void gemv_bf16_f32out(float* y, const bf16* x, const bf16* w, int m, int n, int k) {
    gemv_rows<float>(y, x, w, m, n, k);
}
