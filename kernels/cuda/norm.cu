// RMSNorm, optionally fused with the residual add before it.
#include "common.cuh"

// One block per row of `n` values.
// With `residual`: residual += x (rounded to bf16, as the residual stream is
// stored), then out = rmsnorm(residual) * weight. Without: out = rmsnorm(x) * weight.
// The sum of squares is taken over the bf16-rounded values that are normalized.
extern "C" __global__ void add_rmsnorm_bf16(bf16* __restrict__ out, bf16* __restrict__ residual,
                                            const bf16* __restrict__ x, const bf16* __restrict__ weight,
                                            int n, float eps) {
    const size_t row = blockIdx.x;
    const bf16* xr = x + row * n;
    bf16* rr = residual ? residual + row * n : nullptr;
    bf16* orow = out + row * n;
    float sum_sq = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = to_f32(xr[i]);
        if (rr) {
            const bf16 stored = to_bf16(v + to_f32(rr[i]));
            rr[i] = stored;
            v = to_f32(stored);
        }
        sum_sq += v * v;
    }
    const float scale = rsqrtf(block_sum(sum_sq) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = rr ? to_f32(rr[i]) : to_f32(xr[i]);
        orow[i] = to_bf16(v * scale * to_f32(weight[i]));
    }
}
