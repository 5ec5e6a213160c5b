// Element-wise kernels: SiLU- and GELU-and-multiply, scaling, embedding
// gather, rotary embedding.
#include "common.cuh"

// out[i] = silu(gate[i]) * up[i] over `n` values (grid-stride).
extern "C" __global__ void silu_mul_bf16(bf16* __restrict__ out, const bf16* __restrict__ gate,
                                         const bf16* __restrict__ up, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float g = to_f32(gate[i]);
        out[i] = to_bf16(g / (1.0f + __expf(-g)) * to_f32(up[i]));
    }
}

// out[i] = gelu_tanh(gate[i]) * up[i] over `n` values (grid-stride): the
// tanh approximation, as HF's gelu_pytorch_tanh (Gemma's MLP).
extern "C" __global__ void gelu_tanh_mul_bf16(bf16* __restrict__ out, const bf16* __restrict__ gate,
                                              const bf16* __restrict__ up, long long n) {
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float g = to_f32(gate[i]);
        const float gelu = 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g)));
        out[i] = to_bf16(gelu * to_f32(up[i]));
    }
}

// x[i] *= factor over `n` values (grid-stride): Gemma's embedding scale.
extern "C" __global__ void scale_bf16(bf16* __restrict__ x, float factor, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        x[i] = to_bf16(to_f32(x[i]) * factor);
    }
}

// y[r, c] += bias[c] over `rows` rows of `n` values (grid-stride); the
// q/k/v biases of Qwen2.
extern "C" __global__ void add_bias_bf16(bf16* __restrict__ y, const bf16* __restrict__ bias, long long rows, int n) {
    const long long total = rows * (long long)n;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        y[i] = to_bf16(to_f32(y[i]) + to_f32(bias[i % n]));
    }
}

// out[row, :] = table[ids[row], :] for `rows` rows of `dim` values; one block
// per row. An id outside the vocabulary gives a row of zeros (the engine
// rejects such ids before they get here).
extern "C" __global__ void embedding_bf16(bf16* __restrict__ out, const bf16* __restrict__ table,
                                          const unsigned int* __restrict__ ids, int dim, unsigned int vocab) {
    const size_t row = blockIdx.x;
    const unsigned int id = ids[row];
    bf16* orow = out + row * dim;
    const bf16* trow = table + (size_t)id * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        orow[i] = id < vocab ? trow[i] : to_bf16(0.0f);
    }
}

// Rotary embedding in place, rotate-half (GPT-NeoX / HF Llama) layout:
// x is [tokens, heads, head_dim]; position p rotates pair (i, i + head_dim/2)
// by p * theta^(-2i/head_dim). One block per (token, head).
extern "C" __global__ void rope_neox_bf16(bf16* __restrict__ x, const int* __restrict__ positions,
                                          int heads, int head_dim, float theta) {
    const int token = blockIdx.x / heads;
    const int head = blockIdx.x % heads;
    bf16* v = x + ((size_t)token * heads + head) * head_dim;
    const int half = head_dim / 2;
    const float pos = (float)positions[token];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float inv_freq = powf(theta, -2.0f * (float)i / (float)head_dim);
        float s, c;
        sincosf(pos * inv_freq, &s, &c);
        const float a = to_f32(v[i]);
        const float b = to_f32(v[i + half]);
        v[i] = to_bf16(a * c - b * s);
        v[i + half] = to_bf16(b * c + a * s);
    }
}

// Rotary embedding in place from precomputed tables: x = [tokens, heads,
// head_dim], cos/sin = [tokens, head_dim / 2] (f32, computed by the host with
// the model's frequencies and scaling). `interleaved`: pairs (2i, 2i + 1)
// (llama.cpp's normal mode); else halves (i, i + head_dim / 2).
// One block per (token, head).
extern "C" __global__ void rope_table_bf16(bf16* __restrict__ x, const float* __restrict__ cos_t,
                                           const float* __restrict__ sin_t, int heads, int head_dim,
                                           int interleaved) {
    const int token = blockIdx.x / heads;
    const int half = head_dim / 2;
    bf16* row = x + (size_t)blockIdx.x * head_dim;
    const float* c = cos_t + (size_t)token * half;
    const float* s = sin_t + (size_t)token * half;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const int ia = interleaved ? 2 * i : i;
        const int ib = interleaved ? 2 * i + 1 : i + half;
        const float a = to_f32(row[ia]), b = to_f32(row[ib]);
        row[ia] = to_bf16(a * c[i] - b * s[i]);
        row[ib] = to_bf16(a * s[i] + b * c[i]);
    }
}
