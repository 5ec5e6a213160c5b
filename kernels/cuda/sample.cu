// Sampling on the device: one block per row of f32 logits picks the next
// token (greedy, or temperature + top-k + top-p + min-p with a uniform
// draw supplied by the host's seeded generator) and its logprob, so a step
// copies 8 bytes per sequence back instead of a vocabulary of logits.
//
// The semantics follow the host sampler (engine/src/sampling): NaN logits
// count as -inf and +inf as FLT_MAX, all -inf means uniform; the logprob
// is the log-softmax at temperature 1 before truncation; greedy (or
// top_k == 1, or temperature < 1e-5) takes the argmax, lowest id on ties;
// otherwise p = exp((l - max) / T) (the most likely token has p = 1), then
// top-k, then top-p measured on the top-k set, then min-p (p >= min_p),
// and the token at u · mass of the kept set, in id order. Thresholds are
// found by bisection over the float bit patterns of p, so the vocabulary is
// never sorted; ties at a cut keep the lowest ids, as the host does. A
// sampled row's logits are overwritten with p.
#include "common.cuh"
#include <float.h>
#include <limits.h>

#define SAMPLE_THREADS 1024
#define GREEDY_TEMPERATURE 1e-5f
#define ONE_BITS 0x3F800000u

__device__ __forceinline__ float sanitized(float l) {
    if (isnan(l)) return -INFINITY;
    if (isinf(l) && l > 0.0f) return FLT_MAX;
    return l;
}

// Warp-wide (value, index) max, lowest index on ties; every lane gets it.
__device__ __forceinline__ void warp_argmax(float& v, int& idx) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > v || (ov == v && oi < idx)) {
            v = ov;
            idx = oi;
        }
    }
}

// Block-wide (value, index) max, lowest index on ties; every thread gets it.
__device__ void block_argmax(float& v, int& idx) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    warp_argmax(v, idx);
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = idx;
    }
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? sv[lane] : -INFINITY;
        idx = lane < warps ? si[lane] : INT_MAX;
        warp_argmax(v, idx);
        if (lane == 0) {
            sv[0] = v;
            si[0] = idx;
        }
    }
    __syncthreads();
    v = sv[0];
    idx = si[0];
    __syncthreads();
}

// Block-wide max of an int; every thread gets it.
__device__ int block_max_int(int v) {
    __shared__ int s[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) s[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? s[lane] : INT_MIN;
        for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lane == 0) s[0] = v;
    }
    __syncthreads();
    v = s[0];
    __syncthreads();
    return v;
}

// Sum over the block of each thread's count of p >= `bits` (as floats' bit
// patterns, which order positive floats), and of their mass.
__device__ void kept(const float* p, int vocab, unsigned bits, int& count, float& mass) {
    int c = 0;
    float m = 0.0f;
    for (int t = threadIdx.x; t < vocab; t += blockDim.x) {
        const float v = p[t];
        if (__float_as_uint(v) >= bits && v > 0.0f) {
            c += 1;
            m += v;
        }
    }
    count = (int)block_sum((float)c);
    mass = block_sum(m);
}

// Exclusive prefix sum over the block (blockDim.x == SAMPLE_THREADS).
__device__ float block_exclusive_scan(float w) {
    __shared__ float warp_prefix[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float incl = w;
    for (int o = 1; o < 32; o <<= 1) {
        const float n = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += n;
    }
    if (lane == 31) warp_prefix[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        const float total = lane < warps ? warp_prefix[lane] : 0.0f;
        float run = total;
        for (int o = 1; o < 32; o <<= 1) {
            const float n = __shfl_up_sync(0xffffffffu, run, o);
            if (lane >= o) run += n;
        }
        if (lane < warps) warp_prefix[lane] = run - total;
    }
    __syncthreads();
    const float excl = warp_prefix[warp] + incl - w;
    __syncthreads();
    return excl;
}

// Grid (n), SAMPLE_THREADS threads. Block i samples logits row rows[i]
// (of `vocab` values) with temperature[i], top_k[i] (0 = off), top_p[i]
// (1 = off), min_p[i] (0 = off) and the uniform draw uniform[i] in [0, 1);
// writes tokens[i] and logprobs[i]. Every rows[i] is distinct. Before
// that: the row's grammar mask (mask_row[i] >= 0: row of `masks`, bit t%32
// of word t/32 set = allowed) and its penalties (entries pen_start[i] ..
// pen_start[i+1] of pen_token / pen_count, with repetition[i], presence[i],
// frequency[i]).
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) sample_rows_f32(int* __restrict__ tokens, float* __restrict__ logprobs, float* __restrict__ logits,
                                           const int* __restrict__ rows, const float* __restrict__ temperature,
                                           const int* __restrict__ top_k, const float* __restrict__ top_p,
                                           const float* __restrict__ min_p, const float* __restrict__ uniform, int vocab,
                                           const float* __restrict__ repetition, const float* __restrict__ presence,
                                           const float* __restrict__ frequency, const int* __restrict__ pen_start,
                                           const int* __restrict__ pen_token, const float* __restrict__ pen_count,
                                           const unsigned* __restrict__ masks, const int* __restrict__ mask_row, int mask_words) {
    __shared__ int chosen;
    const int i = blockIdx.x;
    float* l = logits + (size_t)rows[i] * vocab;

    // The grammar's mask: forbidden ids to -inf.
    if (mask_row[i] >= 0) {
        const unsigned* m = masks + (size_t)mask_row[i] * mask_words;
        for (int t = threadIdx.x; t < vocab; t += blockDim.x) {
            if (!((m[t >> 5] >> (t & 31)) & 1u)) l[t] = -INFINITY;
        }
    }
    __syncthreads();
    // Penalties over the row's distinct seen tokens (one entry each): the
    // repetition penalty on every one, then presence and frequency on those
    // in the output (count > 0), as the host applies them.
    const float rp = repetition[i], pres = presence[i], freq = frequency[i];
    for (int e = pen_start[i] + threadIdx.x; e < pen_start[i + 1]; e += blockDim.x) {
        const int t = pen_token[e];
        if (t < 0 || t >= vocab) continue;
        float v = l[t];
        if (rp != 1.0f) v = v > 0.0f ? v / rp : v * rp;
        const float c = pen_count[e];
        // Rounded as the host rounds it (no fused multiply-add).
        if (c > 0.0f) v -= __fadd_rn(__fmul_rn(freq, c), pres);
        l[t] = v;
    }
    __syncthreads();

    float best = -INFINITY;
    int arg = INT_MAX;
    for (int t = threadIdx.x; t < vocab; t += blockDim.x) {
        const float v = sanitized(l[t]);
        if (v > best || (v == best && t < arg)) {
            best = v;
            arg = t;
        }
    }
    block_argmax(best, arg);
    // Every logit -inf: the host makes them all 0 (uniform).
    const bool flat = best == -INFINITY;
    const float mx = flat ? 0.0f : best;
    float z = 0.0f;
    for (int t = threadIdx.x; t < vocab; t += blockDim.x) z += __expf((flat ? 0.0f : sanitized(l[t])) - mx);
    const float log_z = mx + logf(block_sum(z));
    // The chosen token's logit, read before a sampled row is overwritten.
    int token = arg;
    const float T = temperature[i];
    const int K = top_k[i];
    if (!(T < GREEDY_TEMPERATURE || K == 1)) {
        const float inv_t = 1.0f / T;
        for (int t = threadIdx.x; t < vocab; t += blockDim.x) l[t] = __expf(((flat ? 0.0f : sanitized(l[t])) - mx) * inv_t);
        __syncthreads();
        // The kept set is a prefix of the order (p descending, id ascending),
        // written as: every p above `cut`, and the first `quota` ids whose p
        // equals `cut` (the host's tie-break). Without truncation: all p > 0.
        unsigned cut = 0;
        int quota = INT_MAX;
        int count, count_gt;
        float mass, mass_gt;
        kept(l, vocab, 1, count, mass);  // every positive p
        int length = count;
        float prefix_mass = mass;
        if (K > 0 && K < length) {
            // The K-th largest p: the highest cut keeping at least K.
            unsigned lo = 1, hi = ONE_BITS + 1;
            while (hi - lo > 1) {
                const unsigned mid = lo + (hi - lo) / 2;
                kept(l, vocab, mid, count, mass);
                if (count >= K) lo = mid; else hi = mid;
            }
            kept(l, vocab, lo + 1, count_gt, mass_gt);
            cut = lo;
            quota = K - count_gt;
            length = K;
            prefix_mass = mass_gt + quota * __uint_as_float(lo);
        }
        const float P = top_p[i];
        if (P < 1.0f) {
            // Top-p on the top-k prefix: the highest cut whose mass reaches P of it.
            const float target = P * prefix_mass;
            unsigned lo = cut > 0 ? cut : 1, hi = ONE_BITS + 1;
            while (hi - lo > 1) {
                const unsigned mid = lo + (hi - lo) / 2;
                kept(l, vocab, mid, count, mass);
                if (mass >= target) lo = mid; else hi = mid;
            }
            kept(l, vocab, lo + 1, count_gt, mass_gt);
            const float v = __uint_as_float(lo);
            // The fewest ties at `lo` that reach the target (at least one).
            int need = max(1, (int)fminf(ceilf((target - mass_gt) / v), 1073741824.0f));
            const int ties = (lo == cut ? quota : INT_MAX);
            kept(l, vocab, lo, count, mass);
            need = min(need, min(ties, count - count_gt));
            if (count_gt + need < length) {
                cut = lo;
                quota = need;
                length = count_gt + need;
            }
        }
        // Min-p relative to the most likely token (p = 1): all p >= min_p.
        const float mp = min_p[i];
        if (mp > 0.0f) {
            kept(l, vocab, __float_as_uint(mp), count, mass);
            if (count < length) {
                cut = __float_as_uint(mp);
                quota = INT_MAX;
                length = count;
            }
        }
        // The draw: each thread owns a contiguous run of ids; ties at `cut`
        // are ranked in id order across the runs.
        const int run = (vocab + blockDim.x - 1) / blockDim.x;
        const int first = threadIdx.x * run, last = min(first + run, vocab);
        int my_ties = 0;
        for (int t = first; t < last; ++t) my_ties += (__float_as_uint(l[t]) == cut && l[t] > 0.0f);
        const int ties_before = (int)block_exclusive_scan((float)my_ties);
        float w = 0.0f;
        int rank = ties_before, last_kept = -1;
        for (int t = first; t < last; ++t) {
            const float v = l[t];
            const unsigned b = __float_as_uint(v);
            const bool keep = v > 0.0f && (b > cut || (b == cut && rank++ < quota));
            if (keep) {
                w += v;
                last_kept = t;
            }
        }
        const float before = block_exclusive_scan(w);
        const float total = block_sum(w);
        const float target = uniform[i] * total;
        // Exactly one owner: the last run with weight that starts at or below the target.
        const int owner = block_max_int(w > 0.0f && before <= target ? (int)threadIdx.x : -1);
        if ((int)threadIdx.x == owner) {
            float acc = before;
            int pick = last_kept;
            rank = ties_before;
            for (int t = first; t < last; ++t) {
                const float v = l[t];
                const unsigned b = __float_as_uint(v);
                if (v > 0.0f && (b > cut || (b == cut && rank++ < quota))) {
                    acc += v;
                    if (target < acc) {
                        pick = t;
                        break;
                    }
                }
            }
            chosen = pick;
        }
        __syncthreads();
        token = owner >= 0 ? chosen : arg;
        if (threadIdx.x == 0) {
            // logprob from p: l = mx + T · ln p (p > 0 for any kept token).
            const float p = l[token];
            logprobs[i] = p > 0.0f ? mx + T * logf(p) - log_z : -INFINITY;
            tokens[i] = token;
        }
        return;
    }
    if (threadIdx.x == 0) {
        tokens[i] = token;
        logprobs[i] = (flat ? 0.0f : sanitized(l[token])) - log_z;
    }
}
