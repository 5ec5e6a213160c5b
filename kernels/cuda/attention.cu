// Paged KV cache: writing new keys/values into their slots, and decode
// attention (one query token per sequence) over the paged cache, split along
// the context (flash-decoding) so long contexts use the whole GPU.
//
// Cache layout (the CPU backend's, per layer): slot s = block * block_size +
// offset holds one key row and one value row of kv_dim = kv_heads * head_dim
// values at [s * kv_dim]. A sequence's block table lists its blocks in order.
#include "common.cuh"

// Tokens of context one block of the decode kernel handles.
#define PARTITION 256
// Threads of the decode kernel (4 warps).
#define DECODE_THREADS 128
// Widest head the decode kernel takes.
#define MAX_HEAD_DIM 256

// One block per token: k_cache[slot] = k[token], v_cache[slot] = v[token]
// (rows of kv_dim). A negative slot skips the token (padding).
extern "C" __global__ void kv_write_bf16(bf16* __restrict__ k_cache, bf16* __restrict__ v_cache,
                                         const bf16* __restrict__ k, const bf16* __restrict__ v,
                                         const long long* __restrict__ slots, int kv_dim) {
    const size_t token = blockIdx.x;
    const long long slot = slots[token];
    if (slot < 0) return;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        k_cache[(size_t)slot * kv_dim + i] = k[token * kv_dim + i];
        v_cache[(size_t)slot * kv_dim + i] = v[token * kv_dim + i];
    }
}

// Max of `v` over the block (blockDim.x a multiple of 32); every thread gets it.
__device__ __forceinline__ float block_max(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    v = warp_max(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    const int warps = (blockDim.x + 31) >> 5;
    if (warp == 0) {
        float w = lane < warps ? partial[lane] : -INFINITY;
        w = warp_max(w);
        if (lane == 0) partial[0] = w;
    }
    __syncthreads();
    const float total = partial[0];
    __syncthreads();
    return total;
}

// Grid (heads, seqs in this launch, partitions), DECODE_THREADS threads;
// launch sequences are seq_base + blockIdx.y of the batch. Block (h, s, p)
// attends query head h of sequence s over context tokens
// [p * PARTITION, min((p + 1) * PARTITION, context_lens[s])) with the
// sequence's kv head h / (heads / kv_heads).
// With `window` > 0 (a sliding-window layer) only the last `window` tokens
// of the context are attended: partitions wholly before them write an
// empty partial.
// With one partition it writes the normalized result to out[s, h]; with
// several it writes its normalized partial to part_out[s, h, p] and its max
// and exp-sum to part_max / part_sum, for decode_reduce_bf16.
// q and out are [seqs, heads, head_dim]; block_tables [seqs, max_blocks].
extern "C" __global__ void paged_decode_bf16(bf16* __restrict__ out, float* __restrict__ part_out,
                                             float* __restrict__ part_max, float* __restrict__ part_sum,
                                             const bf16* __restrict__ q, const bf16* __restrict__ k_cache,
                                             const bf16* __restrict__ v_cache, const int* __restrict__ block_tables,
                                             const int* __restrict__ context_lens, int max_blocks, int heads,
                                             int kv_heads, int head_dim, int block_size, float scale, int seq_base,
                                             int window) {
    __shared__ float q_s[MAX_HEAD_DIM];
    __shared__ float scores[PARTITION];
    // Sequence s of the whole batch; its partials go to slot `local` of this launch's scratch.
    const int h = blockIdx.x, local = blockIdx.y, s = seq_base + blockIdx.y, p = blockIdx.z;
    const int partitions = gridDim.z;
    const int context = context_lens[s];
    const int lo = window > 0 ? max(0, context - window) : 0;
    const int first = max(p * PARTITION, lo);
    const int last = min(p * PARTITION + PARTITION, context);
    const int kv_dim = kv_heads * head_dim;
    const int kvh = h / (heads / kv_heads);
    const bf16* qh = q + ((size_t)s * heads + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) q_s[d] = to_f32(qh[d]) * scale;
    __syncthreads();

    const int* table = block_tables + (size_t)s * max_blocks;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    // Scores: one warp per token, lanes across the head.
    for (int t = first + warp; t < last; t += warps) {
        const size_t slot = (size_t)table[t / block_size] * block_size + t % block_size;
        const bf16* kr = k_cache + slot * kv_dim + (size_t)kvh * head_dim;
        float dot = 0.0f;
        for (int d = lane; d < head_dim; d += 32) dot += q_s[d] * to_f32(kr[d]);
        dot = warp_sum(dot);
        if (lane == 0) scores[t - first] = dot;
    }
    __syncthreads();
    const int n = last > first ? last - first : 0;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, scores[i]);
    m = block_max(m);
    float partial = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float e = __expf(scores[i] - m);
        scores[i] = e;
        partial += e;
    }
    const float sum = block_sum(partial);  // (block_sum synchronizes, so scores are visible)
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;

    // Values: threads across the head, tokens in order (coalesced rows).
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int t = first; t < last; ++t) {
            const size_t slot = (size_t)table[t / block_size] * block_size + t % block_size;
            acc += scores[t - first] * to_f32(v_cache[slot * kv_dim + (size_t)kvh * head_dim + d]);
        }
        acc *= inv;
        if (partitions == 1) {
            out[((size_t)s * heads + h) * head_dim + d] = to_bf16(acc);
        } else {
            part_out[(((size_t)local * heads + h) * partitions + p) * head_dim + d] = acc;
        }
    }
    if (partitions > 1 && threadIdx.x == 0) {
        const size_t i = ((size_t)local * heads + h) * partitions + p;
        part_max[i] = n > 0 ? m : -INFINITY;
        part_sum[i] = n > 0 ? sum : 0.0f;
    }
}

// Query heads per KV head the grouped decode kernel takes.
#define MAX_GROUP 8

// Eight bf16 values (one 16-byte load) as floats.
__device__ __forceinline__ void unpack8(const uint4 raw, float* f) {
    const unsigned int w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

// Tokens each lane loads ahead in the grouped kernel's loops: 4 takes 128
// registers; 8 (168 registers, fewer blocks resident) measured 20-50% slower
// on an H200 (2026-12-04).
#define GQA_UNROLL 4

// This lane's 16 bytes (at head_off) of the cache rows of tokens
// base + u * token_groups + tg, u < GQA_UNROLL; zeros for tokens from `last`
// on and for an idle lane. `block_ids` holds the blocks from `first_block`.
__device__ __forceinline__ void load_rows(uint4 (&raw)[GQA_UNROLL], const bf16* __restrict__ cache,
                                          const int* block_ids, int first_block, int block_size, int kv_dim,
                                          size_t head_off, int base, int token_groups, int tg, int last, bool active) {
#pragma unroll
    for (int u = 0; u < GQA_UNROLL; ++u) {
        const int t = base + u * token_groups + tg;
        raw[u] = make_uint4(0, 0, 0, 0);
        if (t < last && active) {
            const size_t slot = (size_t)block_ids[t / block_size - first_block] * block_size + t % block_size;
            raw[u] = *reinterpret_cast<const uint4*>(cache + slot * kv_dim + head_off);
        }
    }
}

// paged_decode_bf16's contract (its arguments plus `partition`, the same
// outputs and partials), with partitions of `partition` tokens (at most
// PARTITION) and grid (kv_heads, seqs in this launch, partitions): block
// (g, s, p) attends every query head of KV head g (heads / kv_heads of them,
// at most MAX_GROUP), so each key and value row is read once per group, in
// 16-byte loads. head_dim is a multiple of 8, at most 256; q and the caches
// are 16-byte aligned (the host checks the shape).
// A row of head_dim / 8 chunks is read by `lanes` lanes (the next power of
// two), so a warp covers 32 / lanes tokens at a time; every sum runs in a
// fixed order (the result does not depend on timing).
extern "C" __global__ void __launch_bounds__(DECODE_THREADS)
paged_decode_gqa_bf16(bf16* __restrict__ out, float* __restrict__ part_out, float* __restrict__ part_max,
                      float* __restrict__ part_sum, const bf16* __restrict__ q, const bf16* __restrict__ k_cache,
                      const bf16* __restrict__ v_cache, const int* __restrict__ block_tables,
                      const int* __restrict__ context_lens, int max_blocks, int heads, int kv_heads, int head_dim,
                      int block_size, float scale, int seq_base, int window, int partition) {
    __shared__ float scores[MAX_GROUP][PARTITION];
    // The cache blocks of this partition's tokens (at most partition + 1 of them).
    __shared__ int block_ids[PARTITION + 1];
    // Per token group, per head of the group: the value sums. Token groups
    // times head_dim is at most 4 warps * (32 / lanes) * 8 * lanes = 1024.
    __shared__ float sums[(DECODE_THREADS / 32) * 32 * 8 * MAX_GROUP];
    __shared__ float stat_max[MAX_GROUP], stat_sum[MAX_GROUP];
    const int kvh = blockIdx.x, local = blockIdx.y, s = seq_base + blockIdx.y, p = blockIdx.z;
    const int partitions = gridDim.z;
    const int group = heads / kv_heads;
    const int context = context_lens[s];
    const int lo = window > 0 ? max(0, context - window) : 0;
    const int first = max(p * partition, lo);
    const int last = min(p * partition + partition, context);
    const int n = last > first ? last - first : 0;
    const int kv_dim = kv_heads * head_dim;
    const int chunks = head_dim >> 3;
    // The table entries are read once here, not once per token below.
    const int first_block = first / block_size;
    if (n > 0) {
        const int* row = block_tables + (size_t)s * max_blocks;
        for (int i = threadIdx.x; i <= (last - 1) / block_size - first_block; i += DECODE_THREADS) block_ids[i] = row[first_block + i];
    }
    int lanes = 1;
    while (lanes < chunks) lanes <<= 1;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sub = lane & (lanes - 1), row = lane / lanes;
    const int rows_per_warp = 32 / lanes;
    const int token_groups = (DECODE_THREADS / 32) * rows_per_warp;
    const int tg = warp * rows_per_warp + row;
    const bool active = sub < chunks;
    const size_t head_off = (size_t)kvh * head_dim + (size_t)sub * 8;

    // This lane's eight values of each query head of the group, scaled.
    float qr[MAX_GROUP][8];
#pragma unroll
    for (int g = 0; g < MAX_GROUP; ++g) {
        if (g < group && active) {
            const bf16* qh = q + ((size_t)s * heads + (size_t)kvh * group + g) * head_dim + (size_t)sub * 8;
            unpack8(*reinterpret_cast<const uint4*>(qh), qr[g]);
#pragma unroll
            for (int i = 0; i < 8; ++i) qr[g][i] *= scale;
        } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) qr[g][i] = 0.0f;
        }
    }

    __syncthreads();  // block_ids

    // Scores: each token group takes tokens tg, tg + token_groups, ...; the
    // loop bound is uniform over the warp (the shuffles need every lane).
    for (int base = first; base < last; base += token_groups * GQA_UNROLL) {
        uint4 raw[GQA_UNROLL];
        load_rows(raw, k_cache, block_ids, first_block, block_size, kv_dim, head_off, base, token_groups, tg, last, active);
#pragma unroll
        for (int u = 0; u < GQA_UNROLL; ++u) {
            const int t = base + u * token_groups + tg;
            float k[8];
            unpack8(raw[u], k);
            float dots[MAX_GROUP];
#pragma unroll
            for (int g = 0; g < MAX_GROUP; ++g) {
                float d = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; ++i) d += qr[g][i] * k[i];
                for (int off = lanes >> 1; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
                dots[g] = d;
            }
            if (t < last && sub == 0) {
#pragma unroll
                for (int g = 0; g < MAX_GROUP; ++g)
                    if (g < group) scores[g][t - first] = dots[g];
            }
        }
    }
    __syncthreads();

    // Softmax per head: warp w takes heads w, w + 4, ...
    for (int g = warp; g < group; g += DECODE_THREADS / 32) {
        float m = -INFINITY;
        for (int i = lane; i < n; i += 32) m = fmaxf(m, scores[g][i]);
        m = warp_max(m);
        float partial = 0.0f;
        for (int i = lane; i < n; i += 32) {
            const float e = __expf(scores[g][i] - m);
            scores[g][i] = e;
            partial += e;
        }
        partial = warp_sum(partial);
        if (lane == 0) {
            stat_max[g] = m;
            stat_sum[g] = partial;
        }
    }
    __syncthreads();

    // Values: the same token groups; each lane sums its eight dimensions of
    // every head of the group over its tokens.
    float acc[MAX_GROUP][8];
#pragma unroll
    for (int g = 0; g < MAX_GROUP; ++g)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = 0.0f;
    for (int base = first; base < last; base += token_groups * GQA_UNROLL) {
        uint4 raw[GQA_UNROLL];
        load_rows(raw, v_cache, block_ids, first_block, block_size, kv_dim, head_off, base, token_groups, tg, last, active);
#pragma unroll
        for (int u = 0; u < GQA_UNROLL; ++u) {
            const int t = base + u * token_groups + tg;
            if (t < last && active) {
                float v[8];
                unpack8(raw[u], v);
#pragma unroll
                for (int g = 0; g < MAX_GROUP; ++g) {
                    if (g < group) {
                        const float w = scores[g][t - first];
#pragma unroll
                        for (int i = 0; i < 8; ++i) acc[g][i] += w * v[i];
                    }
                }
            }
        }
    }
    if (active) {
#pragma unroll
        for (int g = 0; g < MAX_GROUP; ++g) {
            if (g < group) {
                float* dst = sums + ((size_t)tg * group + g) * head_dim + (size_t)sub * 8;
#pragma unroll
                for (int i = 0; i < 8; ++i) dst[i] = acc[g][i];
            }
        }
    }
    __syncthreads();

    // Token groups summed in order, normalized, written per query head.
    for (int idx = threadIdx.x; idx < group * head_dim; idx += DECODE_THREADS) {
        const int g = idx / head_dim, d = idx - g * head_dim;
        float total = 0.0f;
        for (int j = 0; j < token_groups; ++j) total += sums[((size_t)j * group + g) * head_dim + d];
        const float sum = stat_sum[g];
        total *= sum > 0.0f ? 1.0f / sum : 0.0f;
        const int h = kvh * group + g;
        if (partitions == 1) {
            out[((size_t)s * heads + h) * head_dim + d] = to_bf16(total);
        } else {
            part_out[(((size_t)local * heads + h) * partitions + p) * head_dim + d] = total;
        }
    }
    if (partitions > 1 && threadIdx.x < group) {
        const int h = kvh * group + threadIdx.x;
        const size_t i = ((size_t)local * heads + h) * partitions + p;
        part_max[i] = n > 0 ? stat_max[threadIdx.x] : -INFINITY;
        part_sum[i] = n > 0 ? stat_sum[threadIdx.x] : 0.0f;
    }
}

// Grid (heads, seqs): combines the partitions (of `partition` tokens) of
// paged_decode_bf16 or paged_decode_gqa_bf16,
// out = sum_p w_p * part_out_p / sum_p w_p with w_p = part_sum_p * exp(part_max_p - max).
extern "C" __global__ void decode_reduce_bf16(bf16* __restrict__ out, const float* __restrict__ part_out,
                                              const float* __restrict__ part_max, const float* __restrict__ part_sum,
                                              const int* __restrict__ context_lens, int heads, int head_dim,
                                              int partitions, int seq_base, int partition) {
    const int h = blockIdx.x, local = blockIdx.y, s = seq_base + blockIdx.y;
    const int used = min((context_lens[s] + partition - 1) / partition, partitions);
    const size_t base = ((size_t)local * heads + h) * partitions;
    float m = -INFINITY;
    for (int p = 0; p < used; ++p) m = fmaxf(m, part_max[base + p]);
    float total = 0.0f;
    for (int p = 0; p < used; ++p) total += part_sum[base + p] * __expf(part_max[base + p] - m);
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int p = 0; p < used; ++p) {
            acc += part_sum[base + p] * __expf(part_max[base + p] - m) * part_out[(base + p) * head_dim + d];
        }
        out[((size_t)s * heads + h) * head_dim + d] = to_bf16(acc * inv);
    }
}
