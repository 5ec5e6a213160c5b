"""How far bf16 weights and bf16 activations move SmolLM2-135M's logits from
an f32 forward: the bound the CUDA backend's comparison with the CPU backend
(tests/tests/cuda_forward.rs, `REAL`) is set from.

Runs numpy_forward's Llama path with a rounding hook (round-to-nearest-even
to bfloat16) on the weights and on every activation stored between kernels
(variant A: the residual stream too, as the CUDA backend does; B: residual
in f32), matmuls, norms and softmax in f32, logits in f32.

    python tools/reference/bf16_emulation.py   # SPINDLE_MODEL_GGUF, else the model cache

Measured (numpy 2.4, gguf 0.19): A 3.2e-2 over all 27 positions (0.008 to
0.115 at single positions), B 1.4e-2; argmax equal at all 27 in both.
"""
import sys, math, glob, os
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_forward as nf

def bf16(a):
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = a.view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32)

def ident(a): return a

def forward(m, ids, R_act, R_res, dtype=np.float32):
    """Same math as numpy_forward.Forward (Llama path), with rounding hooks."""
    c = m.config
    T = len(ids)
    nh, nkv, hd = c.num_heads, c.num_kv_heads, c.head_dim
    group = nh // nkv
    inv = nf.rope_inv_freq(c)
    freqs = np.outer(np.arange(T, dtype=np.float64), inv)
    emb = np.concatenate([freqs, freqs], -1)
    cos, sin = np.cos(emb).astype(dtype), np.sin(emb).astype(dtype)
    mask = np.arange(T)[None, :] > np.arange(T)[:, None]
    eps = c.rms_norm_eps
    x = R_act(m.embed[np.asarray(ids)])                       # embedding lookup output
    for L in m.layers:
        h = R_act(nf.rms_norm(x, L.attn_norm, eps))
        q = R_act(h @ L.wq.T); k = R_act(h @ L.wk.T); v = R_act(h @ L.wv.T)
        q = q.reshape(T, nh, hd).transpose(1, 0, 2)
        k = k.reshape(T, nkv, hd).transpose(1, 0, 2)
        v = v.reshape(T, nkv, hd).transpose(1, 0, 2)
        q = R_act(q * cos + nf.rotate_half(q) * sin)
        k = R_act(k * cos + nf.rotate_half(k) * sin)
        K = np.repeat(k, group, 0); V = np.repeat(v, group, 0)
        s = (q @ K.transpose(0, 2, 1)) * dtype(1.0 / math.sqrt(hd))
        s = np.where(mask[None], -np.inf, s)
        s = s - s.max(-1, keepdims=True)
        p = np.exp(s); p = p / p.sum(-1, keepdims=True)         # softmax stays f32
        a = R_act((p @ V).transpose(1, 0, 2).reshape(T, nh * hd))
        o = R_act(a @ L.wo.T)
        x = R_res(x + o)
        h = R_act(nf.rms_norm(x, L.ffn_norm, eps))
        g = R_act(h @ L.w_gate.T); u = R_act(h @ L.w_up.T)
        gu = R_act(nf.silu(g) * u)
        f = R_act(gu @ L.w_down.T)
        x = R_res(x + f)
    x = R_act(nf.rms_norm(x, m.final_norm, eps))
    return x @ m.lm_head.T                                      # logits f32

def round_model(m):
    import copy
    r = copy.copy(m)
    r.embed = bf16(m.embed); r.lm_head = r.embed if m.tied else bf16(m.lm_head)
    r.final_norm = bf16(m.final_norm)
    r.layers = []
    for L in m.layers:
        L2 = copy.copy(L)
        for n in ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w_gate", "w_up", "w_down"):
            setattr(L2, n, bf16(getattr(L, n)))
        assert L.bq is None and L.bk is None and L.bv is None and L.bo is None and L.q_norm is None
        r.layers.append(L2)
    return r

def rel(a, b): return float(np.sqrt(((a.astype(np.float64) - b) ** 2).sum() / (b.astype(np.float64) ** 2).sum()))

def report(name, a, b):
    agree = int((a.argmax(-1) == b.argmax(-1)).sum())
    print(f"{name:38s} rel_all={rel(a,b):.4e} rel_last={rel(a[-1],b[-1]):.4e} argmax_agree={agree}/{len(b)} max_abs={np.abs(a-b).max():.3f}")

ids = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]
path = os.environ.get("SPINDLE_MODEL_GGUF") or glob.glob(os.path.expanduser("~/.cache/spindle/models/smollm2-135m-instruct/*.gguf"))[0]
m32 = nf.load_gguf(path, dtype=np.float32)
print("arch", m32.config.arch, "tied", m32.tied, "layers", m32.config.num_layers, "vocab", m32.config.vocab_size)
ref = forward(m32, ids, ident, ident)
# sanity: identical to the repo's own Forward in f32
ref2 = nf.Forward(m32)(ids)
print("check vs numpy_forward.Forward f32: rel", rel(ref, ref2))
mb = round_model(m32)
full = forward(mb, ids, bf16, bf16)
resf = forward(mb, ids, bf16, ident)
wonly = forward(mb, ids, ident, ident)
report("A: bf16 weights + bf16 acts + bf16 res", full, ref)
report("B: bf16 weights + bf16 acts, f32 res", resf, ref)
report("(extra) bf16 weights only", wonly, ref)
report("(extra) bf16 acts+res, f32 weights", forward(m32, ids, bf16, bf16), ref)
m64 = nf.load_gguf(path, dtype=np.float64)
r64 = forward(m64, ids, ident, ident, dtype=np.float64)
report("(floor) f32 vs f64", ref, r64)
print("ref last-pos top1/top2 gap per position:",
      np.round(np.sort(ref, -1)[:, -1] - np.sort(ref, -1)[:, -2], 3).tolist())
print("logit rms all:", float(np.sqrt((ref.astype(np.float64)**2).mean())))
def perpos(a, b): return [round(rel(a[i], b[i]), 4) for i in range(len(b))]
print("A per-position rel:", perpos(full, ref))
print("B per-position rel:", perpos(resf, ref))
print("A rel excluding pos 0:", rel(full[1:], ref[1:]), " B:", rel(resf[1:], ref[1:]))
