// Prefill attention over the paged KV cache, flash-attention style: causal,
// any number of sequences of any lengths in one launch (varlen), keys and
// values read from the cache (so a prompt's cached prefix is attended
// without recomputation), tensor cores (WMMA bf16, f32 accumulate) for
// Q·Kᵀ and P·V, and an online softmax so the scores never leave shared
// memory.
//
// Grid (query tiles, heads, seqs), PF_THREADS threads (4 warps, 16 query
// rows each). Block (x, h, s) handles the new tokens [64x, 64x + 64) of
// sequence s for query head h: their rows are q[q_starts[s] + i] and their
// positions start_pos[s] + i, and each attends to the keys at positions
// up to its own (the cache already holds this step's keys: kv_write runs
// first). GQA by heads / kv_heads. With `window` > 0 (a sliding-window
// layer) a query at position p sees only keys j with p - j < window, and key
// tiles before every row's window are skipped. head_dim is a multiple of 16, at most
// 256; the dynamic shared memory is PrefillShape::shared_bytes (in
// src/device/prefill.rs, which mirrors the carve-up below).
#include "common.cuh"
#include <mma.h>
using namespace nvcuda;

#define PF_M 64
#define PF_N 64
#define PF_THREADS 128

extern "C" __global__ void paged_prefill_bf16(bf16* __restrict__ out, const bf16* __restrict__ q,
                                              const bf16* __restrict__ k_cache, const bf16* __restrict__ v_cache,
                                              const int* __restrict__ block_tables, const int* __restrict__ q_starts,
                                              const int* __restrict__ start_pos, int max_blocks, int heads,
                                              int kv_heads, int head_dim, int block_size, float scale,
                                              int window) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int D = head_dim;
    // Row strides, padded against bank conflicts; every 16-row band and
    // 16-column step stays 32-byte aligned, as WMMA needs.
    const int LD = D + 8, LDO = D + 4, LDS = PF_N + 4, LDP = PF_N + 8;
    bf16* Qs = reinterpret_cast<bf16*>(smem);
    bf16* Ks = Qs + PF_M * LD;
    bf16* Vs = Ks + PF_N * LD;
    float* Ss = reinterpret_cast<float*>(Vs + PF_N * LD);
    bf16* Ps = reinterpret_cast<bf16*>(Ss + PF_M * LDS);
    float* Os = reinterpret_cast<float*>(Ps + PF_M * LDP);
    float* row_max = Os + PF_M * LDO;
    float* row_sum = row_max + PF_M;

    const int h = blockIdx.y, s = blockIdx.z;
    const int first = q_starts[s], n_new = q_starts[s + 1] - first;
    const int m0 = blockIdx.x * PF_M;
    if (m0 >= n_new) return;  // the whole block leaves together
    const int rows = min(PF_M, n_new - m0);
    const int pos0 = start_pos[s] + m0;  // the tile's first query position
    const int ctx_end = pos0 + rows;     // keys [0, ctx_end) are seen by some row
    const int kvh = h / (heads / kv_heads);
    const size_t kv_dim = (size_t)kv_heads * D;
    const int* table = block_tables + (size_t)s * max_blocks;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int chunks = D / 8;  // 16-byte loads per row

    for (int i = threadIdx.x; i < PF_M * chunks; i += blockDim.x) {
        const int r = i / chunks, c = (i % chunks) * 8;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (r < rows) val = *reinterpret_cast<const uint4*>(q + ((size_t)(first + m0 + r) * heads + h) * D + c);
        *reinterpret_cast<uint4*>(Qs + r * LD + c) = val;
    }
    for (int i = threadIdx.x; i < PF_M * D; i += blockDim.x) Os[(i / D) * LDO + i % D] = 0.0f;
    for (int r = threadIdx.x; r < PF_M; r += blockDim.x) {
        row_max[r] = -INFINITY;
        row_sum[r] = 0.0f;
    }
    __syncthreads();

    // The first key any row of the tile sees, rounded down to a key tile.
    const int key_lo = window > 0 ? max(0, pos0 - window + 1) / PF_N * PF_N : 0;
    for (int n0 = key_lo; n0 < ctx_end; n0 += PF_N) {
        // Keys and values n0 .. n0 + 63 (zeros past ctx_end, never garbage).
        for (int i = threadIdx.x; i < PF_N * chunks; i += blockDim.x) {
            const int j = i / chunks, c = (i % chunks) * 8, t = n0 + j;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
            if (t < ctx_end) {
                const size_t slot = (size_t)table[t / block_size] * block_size + t % block_size;
                const size_t off = slot * kv_dim + (size_t)kvh * D + c;
                kv = *reinterpret_cast<const uint4*>(k_cache + off);
                vv = *reinterpret_cast<const uint4*>(v_cache + off);
            }
            *reinterpret_cast<uint4*>(Ks + j * LD + c) = kv;
            *reinterpret_cast<uint4*>(Vs + j * LD + c) = vv;
        }
        __syncthreads();

        // S = Q·Kᵀ for this warp's 16 rows (Kᵀ read column-major from K's rows).
        {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[PF_N / 16];
            for (int j = 0; j < PF_N / 16; ++j) wmma::fill_fragment(acc[j], 0.0f);
            for (int kk = 0; kk < D; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
                wmma::load_matrix_sync(a, Qs + warp * 16 * LD + kk, LD);
                for (int j = 0; j < PF_N / 16; ++j) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;
                    wmma::load_matrix_sync(b, Ks + j * 16 * LD + kk, LD);
                    wmma::mma_sync(acc[j], a, b, acc[j]);
                }
            }
            for (int j = 0; j < PF_N / 16; ++j) {
                wmma::store_matrix_sync(Ss + warp * 16 * LDS + j * 16, acc[j], LDS, wmma::mem_row_major);
            }
        }
        __syncwarp();

        // Online softmax, one row at a time, lanes over the 64 columns: the
        // causal mask, the running max and sum, P in bf16, O rescaled.
        for (int rr = 0; rr < 16; ++rr) {
            const int r = warp * 16 + rr;
            const int pos = pos0 + r;
            const bool live = r < rows;
            const int lo = window > 0 ? pos - window + 1 : 0;  // the row's first visible key
            const int j0 = n0 + lane, j1 = n0 + lane + 32;
            const float v0 = (live && j0 <= pos && j0 >= lo) ? Ss[r * LDS + lane] * scale : -INFINITY;
            const float v1 = (live && j1 <= pos && j1 >= lo) ? Ss[r * LDS + lane + 32] * scale : -INFINITY;
            const float old_max = row_max[r];
            const float new_max = fmaxf(old_max, warp_max(fmaxf(v0, v1)));
            const float base = new_max == -INFINITY ? 0.0f : new_max;
            const float p0 = __expf(v0 - base), p1 = __expf(v1 - base);
            const float alpha = __expf(old_max - base);
            const float psum = warp_sum(p0 + p1);
            Ps[r * LDP + lane] = to_bf16(p0);
            Ps[r * LDP + lane + 32] = to_bf16(p1);
            for (int d = lane; d < D; d += 32) Os[r * LDO + d] *= alpha;
            __syncwarp();
            if (lane == 0) {
                row_max[r] = new_max;
                row_sum[r] = row_sum[r] * alpha + psum;
            }
        }
        __syncwarp();

        // O += P·V for this warp's rows, 16 columns of the head at a time.
        for (int dc = 0; dc < D; dc += 16) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> o;
            wmma::load_matrix_sync(o, Os + warp * 16 * LDO + dc, LDO, wmma::mem_row_major);
            for (int kk = 0; kk < PF_N; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> b;
                wmma::load_matrix_sync(a, Ps + warp * 16 * LDP + kk, LDP);
                wmma::load_matrix_sync(b, Vs + kk * LD + dc, LD);
                wmma::mma_sync(o, a, b, o);
            }
            wmma::store_matrix_sync(Os + warp * 16 * LDO + dc, o, LDO, wmma::mem_row_major);
        }
        __syncthreads();  // every warp is done with Ks and Vs before the next tile
    }

    for (int i = threadIdx.x; i < rows * D; i += blockDim.x) {
        const int r = i / D, d = i % D;
        const float sum = row_sum[r];
        out[((size_t)(first + m0 + r) * heads + h) * D + d] = to_bf16(sum > 0.0f ? Os[r * LDO + d] / sum : 0.0f);
    }
}
