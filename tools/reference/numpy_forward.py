#!/usr/bin/env python3
"""Independent numpy reference forward pass for Llama-family decoders.

This is a plain, readable re-implementation of the decoder as Hugging Face
transformers defines it (LlamaForCausalLM / Qwen3ForCausalLM, and the text
part of Gemma 3, Gemma3ForCausalLM), written to produce reference logits for
Spindle's tests. It shares no code with Spindle.

Model pieces implemented:
  * RMSNorm:  w * x / sqrt(mean(x^2) + eps)
  * RoPE in HF's "rotate_half" (NeoX) layout, inv_freq = theta^(-2i/d),
    with optional "llama3" or "linear" rope scaling (HF config) or a GGUF
    `rope_freqs.weight` tensor (how llama.cpp stores llama3 scaling)
  * grouped-query attention (num_key_value_heads <= num_attention_heads),
    causal, scale 1/sqrt(head_dim), optional q/k/v/o biases
  * optional Qwen3 per-head q_norm / k_norm (RMSNorm over head_dim, applied
    before RoPE)
  * SwiGLU MLP: down(silu(gate(x)) * up(x))
  * final RMSNorm, lm_head (tied to the embedding when lm_head is absent or
    tie_word_embeddings is true)
  * Gemma 3 (GGUF arch `gemma3`, HF `gemma3_text`): embeddings scaled by sqrt(hidden);
    RMSNorm after attention and after the MLP (before the residual add);
    GeGLU MLP down(gelu_tanh(gate(x)) * up(x)); attention scale
    query_pre_attn_scalar^-0.5; sliding-window layers (a query at position p
    sees keys j with p - j < window) with their own RoPE base (10000), every
    6th layer global (full causal attention, rope.freq_base); from an HF
    directory, the layer kinds, local base and scalar come from config.json
    and the (1 + w) norms have their 1 added at load.

All arithmetic is done in float64 by default (weights are upcast once at
load time; every matmul, norm, softmax accumulates in float64). Pass
dtype=np.float32 (or --dtype float32) for a float32 run.

Weight sources:
  (a) GGUF, read with the `gguf` package and dequantized with
      gguf.quants.dequantize. llama.cpp's converter permutes the rows of
      attn_q / attn_k for the `llama` architecture (so that its interleaved
      "NORM" RoPE can be used); we undo that permutation here so that HF's
      rotate_half RoPE applies.
  (b) a Hugging Face directory: config.json + *.safetensors, parsed by hand
      (header JSON + raw little-endian buffers; bf16 -> f32 by bit shift).

Command line (quick check):
  python numpy_forward.py --gguf FILE.gguf --chat "What is the capital of France?"
  python numpy_forward.py --hf-dir DIR --prompt-ids 1,2,3 --max-new 8
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np


# --------------------------------------------------------------------------
# Config and weights
# --------------------------------------------------------------------------

@dataclass
class Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Optional[dict] = None   # HF-style dict: rope_type/type, factor, ...
    rope_freq_factors: Optional[np.ndarray] = None  # GGUF rope_freqs.weight
    qk_norm: bool = False
    arch: str = "llama"
    bos_token_id: Optional[int] = None
    eos_token_id: Optional[int] = None
    # Gemma 3 parts; the defaults are the Llama/Qwen behaviour.
    embed_scale: Optional[float] = None      # h = embed[ids] * embed_scale
    attn_scale: Optional[float] = None       # None: 1/sqrt(head_dim)
    mlp_act: str = "silu"                    # "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    sliding_window: Optional[int] = None     # window of the sliding layers
    sliding_layers: Optional[list] = None    # per layer: True = sliding, False = global
    rope_local_theta: Optional[float] = None  # RoPE base of the sliding layers (no scaling)


@dataclass
class Layer:
    attn_norm: np.ndarray
    wq: np.ndarray            # [num_heads*head_dim, hidden]
    wk: np.ndarray            # [num_kv_heads*head_dim, hidden]
    wv: np.ndarray            # [num_kv_heads*head_dim, hidden]
    wo: np.ndarray            # [hidden, num_heads*head_dim]
    ffn_norm: np.ndarray
    w_gate: np.ndarray        # [intermediate, hidden]
    w_up: np.ndarray          # [intermediate, hidden]
    w_down: np.ndarray        # [hidden, intermediate]
    bq: Optional[np.ndarray] = None
    bk: Optional[np.ndarray] = None
    bv: Optional[np.ndarray] = None
    bo: Optional[np.ndarray] = None
    q_norm: Optional[np.ndarray] = None   # [head_dim]
    k_norm: Optional[np.ndarray] = None   # [head_dim]
    post_attn_norm: Optional[np.ndarray] = None  # Gemma 3: on the attention output
    post_ffn_norm: Optional[np.ndarray] = None   # Gemma 3: on the MLP output


@dataclass
class Model:
    config: Config
    embed: np.ndarray         # [vocab, hidden]
    layers: list
    final_norm: np.ndarray
    lm_head: np.ndarray       # [vocab, hidden] (may be the same object as embed)
    tied: bool = False
    source: dict = field(default_factory=dict)


# --------------------------------------------------------------------------
# GGUF loading
# --------------------------------------------------------------------------

def unpermute_llama_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp convert_hf_to_gguf.py's permute().

    permute(): w.reshape(n_head, 2, hd//2, *rest).swapaxes(1, 2).reshape(shape)
    i.e. HF row (h, j*hd/2 + i) goes to GGUF row (h, 2*i + j). The inverse
    reshapes as (n_head, hd//2, 2, *rest) and swaps axes back.
    Works for both matrices [out, in] and bias vectors [out].
    """
    shape = w.shape
    hd = shape[0] // n_head
    return w.reshape(n_head, hd // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _gguf_field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def load_gguf(path: str, dtype=np.float64) -> Model:
    import gguf  # the `gguf` package from llama.cpp's gguf-py

    reader = gguf.GGUFReader(path)
    arch = _gguf_field(reader, "general.architecture")
    k = lambda name: f"{arch}.{name}"

    tensors = {t.name: t for t in reader.tensors}

    def get(name, required=True):
        t = tensors.get(name)
        if t is None:
            if required:
                raise KeyError(f"GGUF tensor {name} missing")
            return None
        # gguf.quants.dequantize returns float32 with numpy shape = reversed
        # GGUF dims, i.e. [out, in] for a weight matrix.
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        want = tuple(int(d) for d in reversed(list(t.shape)))
        a = np.asarray(a).reshape(want)
        return a.astype(dtype)

    hidden = int(_gguf_field(reader, k("embedding_length")))
    n_heads = int(_gguf_field(reader, k("attention.head_count")))
    n_kv = int(_gguf_field(reader, k("attention.head_count_kv"), n_heads))
    head_dim = int(_gguf_field(reader, k("attention.key_length"), hidden // n_heads))
    rope_dim = int(_gguf_field(reader, k("rope.dimension_count"), head_dim))
    if rope_dim != head_dim:
        raise NotImplementedError(f"partial rotary (rope dim {rope_dim} != head_dim {head_dim})")
    n_layers = int(_gguf_field(reader, k("block_count")))
    embed = get("token_embd.weight")

    rope_scaling = None
    stype = _gguf_field(reader, k("rope.scaling.type"))
    if stype in ("linear",):
        rope_scaling = {"rope_type": "linear", "factor": float(_gguf_field(reader, k("rope.scaling.factor")))}
    elif stype not in (None, "none"):
        raise NotImplementedError(f"GGUF rope scaling type {stype}")
    rope_freqs = tensors.get("rope_freqs.weight")

    if arch.startswith("gemma") and arch != "gemma3":
        raise NotImplementedError(f"GGUF architecture {arch}")
    gemma3 = {}
    if arch == "gemma3":
        # Gemma 3 as transformers' Gemma3TextModel defines it. The GGUF has no
        # key for the layer pattern or the local RoPE base: llama.cpp hard-codes
        # them for gemma3 (every 6th layer global; sliding layers rope base
        # 10000), as do the HF configs of all Gemma 3 sizes. llama.cpp scales
        # attention by 1/sqrt(head_dim) (query_pre_attn_scalar = head_dim = 256
        # for the 270M; only the 27B differs). The converter has already added
        # 1 to every norm weight (HF's Gemma RMSNorm is x/rms * (1 + w)), so
        # the GGUF norms are plain w * x/rms.
        window = _gguf_field(reader, k("attention.sliding_window"))
        gemma3 = dict(
            embed_scale=math.sqrt(hidden),
            attn_scale=1.0 / math.sqrt(head_dim),
            mlp_act="gelu_tanh",
            sliding_window=int(window),
            sliding_layers=[(i + 1) % 6 != 0 for i in range(n_layers)],
            rope_local_theta=10000.0,
        )

    cfg = Config(
        vocab_size=embed.shape[0],
        hidden_size=hidden,
        intermediate_size=int(_gguf_field(reader, k("feed_forward_length"))),
        num_layers=n_layers,
        num_heads=n_heads,
        num_kv_heads=n_kv,
        head_dim=head_dim,
        rms_norm_eps=float(_gguf_field(reader, k("attention.layer_norm_rms_epsilon"))),
        rope_theta=float(_gguf_field(reader, k("rope.freq_base"), 10000.0)),
        rope_scaling=rope_scaling,
        rope_freq_factors=(get("rope_freqs.weight").astype(np.float64) if rope_freqs is not None else None),
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        arch=arch,
        bos_token_id=_gguf_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_gguf_field(reader, "tokenizer.ggml.eos_token_id"),
        **gemma3,
    )

    # Only llama.cpp's LlamaModel converter permutes Q/K (it is also used for
    # mistral-style checkpoints, which keep arch "llama"). Qwen2/Qwen3 use
    # NEOX rope in llama.cpp and are stored unpermuted.
    permuted = arch == "llama"

    layers = []
    for i in range(n_layers):
        p = f"blk.{i}."
        wq, wk = get(p + "attn_q.weight"), get(p + "attn_k.weight")
        bq, bk = get(p + "attn_q.bias", False), get(p + "attn_k.bias", False)
        if permuted:
            wq, wk = unpermute_llama_qk(wq, n_heads), unpermute_llama_qk(wk, n_kv)
            bq = unpermute_llama_qk(bq, n_heads) if bq is not None else None
            bk = unpermute_llama_qk(bk, n_kv) if bk is not None else None
        layers.append(Layer(
            attn_norm=get(p + "attn_norm.weight"),
            wq=wq, wk=wk,
            wv=get(p + "attn_v.weight"),
            wo=get(p + "attn_output.weight"),
            ffn_norm=get(p + "ffn_norm.weight"),
            w_gate=get(p + "ffn_gate.weight"),
            w_up=get(p + "ffn_up.weight"),
            w_down=get(p + "ffn_down.weight"),
            bq=bq, bk=bk,
            bv=get(p + "attn_v.bias", False),
            bo=get(p + "attn_output.bias", False),
            q_norm=get(p + "attn_q_norm.weight", False),
            k_norm=get(p + "attn_k_norm.weight", False),
            post_attn_norm=get(p + "post_attention_norm.weight", arch == "gemma3"),
            post_ffn_norm=get(p + "post_ffw_norm.weight", arch == "gemma3"),
        ))
    lm_head = get("output.weight", False)
    tied = lm_head is None
    model = Model(cfg, embed, layers, get("output_norm.weight"),
                  embed if tied else lm_head, tied=tied,
                  source={"kind": "gguf", "path": os.path.abspath(path), "qk_unpermuted": permuted})
    _check_shapes(model)
    return model


# --------------------------------------------------------------------------
# Hugging Face directory loading (safetensors parsed by hand)
# --------------------------------------------------------------------------

_ST_DTYPES = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"), "I64": np.dtype("<i8"), "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"), "I8": np.dtype("i1"), "U8": np.dtype("u1"),
}


def read_safetensors(path: str) -> dict:
    """Return {name: float32/float64 numpy array} from one .safetensors file."""
    out = {}
    with open(path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen))
        base = 8 + hlen
        buf = np.memmap(path, dtype=np.uint8, mode="r")
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = info["dtype"]
        if dt not in _ST_DTYPES:
            raise NotImplementedError(f"safetensors dtype {dt} ({name})")
        s, e = info["data_offsets"]
        raw = np.frombuffer(buf[base + s: base + e].tobytes(), dtype=_ST_DTYPES[dt])
        if dt == "BF16":
            arr = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            arr = raw
        out[name] = arr.reshape(info["shape"])
    return out


def load_hf_dir(path: str, dtype=np.float64) -> Model:
    with open(os.path.join(path, "config.json")) as f:
        c = json.load(f)
    if "text_config" in c:  # multimodal wrappers
        c = {**c, **c["text_config"]}
    model_type = str(c.get("model_type", ""))
    if model_type.startswith("gemma") and model_type not in ("gemma3_text", "gemma3"):
        raise NotImplementedError(f"HF model_type {model_type}")
    gemma3 = model_type in ("gemma3_text", "gemma3")

    files = []
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.exists(os.path.join(path, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        files = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors in {path}")
    W = {}
    for fn in files:
        W.update(read_safetensors(os.path.join(path, fn)))

    def get(name, required=True):
        if name not in W:
            if required:
                raise KeyError(f"tensor {name} missing")
            return None
        return np.asarray(W[name]).astype(dtype)

    hidden = int(c["hidden_size"])
    n_heads = int(c["num_attention_heads"])
    n_kv = int(c.get("num_key_value_heads") or n_heads)
    head_dim = int(c.get("head_dim") or hidden // n_heads)
    if c.get("partial_rotary_factor", 1.0) != 1.0:
        raise NotImplementedError("partial_rotary_factor != 1")

    # transformers >= 5 may move rope settings into `rope_parameters`.
    rp = c.get("rope_parameters") or {}
    rs = c.get("rope_scaling") or None
    if rs is None and rp.get("rope_type", "default") not in ("default", None):
        rs = rp
    theta = c.get("rope_theta", rp.get("rope_theta", 10000.0))
    if gemma3 and "full_attention" in rp:
        # transformers 5 keys Gemma 3's RoPE by layer type: the global layers'
        # base and scaling are under `full_attention`.
        full = rp["full_attention"] or {}
        theta = c.get("rope_theta", full.get("rope_theta", 10000.0))
        if rs is None and full.get("rope_type", "default") not in ("default", None):
            rs = full

    prefix = "model."
    if "model.embed_tokens.weight" not in W and "model.language_model.embed_tokens.weight" in W:
        prefix = "model.language_model."
    embed = get(prefix + "embed_tokens.weight")
    eos = c.get("eos_token_id")
    cfg = Config(
        **(_hf_gemma3_parts(c, hidden, int(c["num_hidden_layers"]), head_dim) if gemma3 else {}),
        vocab_size=int(c.get("vocab_size", embed.shape[0])),
        hidden_size=hidden,
        intermediate_size=int(c["intermediate_size"]),
        num_layers=int(c["num_hidden_layers"]),
        num_heads=n_heads,
        num_kv_heads=n_kv,
        head_dim=head_dim,
        rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        rope_scaling=rs,
        qk_norm=(prefix + "layers.0.self_attn.q_norm.weight") in W,
        arch=(c.get("model_type") or "llama"),
        bos_token_id=c.get("bos_token_id"),
        eos_token_id=eos[0] if isinstance(eos, list) else eos,
    )
    layers = []
    for i in range(cfg.num_layers):
        p = f"{prefix}layers.{i}."
        layers.append(Layer(
            attn_norm=get(p + "input_layernorm.weight"),
            wq=get(p + "self_attn.q_proj.weight"),
            wk=get(p + "self_attn.k_proj.weight"),
            wv=get(p + "self_attn.v_proj.weight"),
            wo=get(p + "self_attn.o_proj.weight"),
            ffn_norm=get(p + ("pre_feedforward_layernorm.weight" if gemma3 else "post_attention_layernorm.weight")),
            w_gate=get(p + "mlp.gate_proj.weight"),
            w_up=get(p + "mlp.up_proj.weight"),
            w_down=get(p + "mlp.down_proj.weight"),
            bq=get(p + "self_attn.q_proj.bias", False),
            bk=get(p + "self_attn.k_proj.bias", False),
            bv=get(p + "self_attn.v_proj.bias", False),
            bo=get(p + "self_attn.o_proj.bias", False),
            q_norm=get(p + "self_attn.q_norm.weight", False),
            k_norm=get(p + "self_attn.k_norm.weight", False),
            post_attn_norm=get(p + "post_attention_layernorm.weight") if gemma3 else None,
            post_ffn_norm=get(p + "post_feedforward_layernorm.weight") if gemma3 else None,
        ))
    final_norm = get(prefix + "norm.weight")
    if gemma3:
        # HF's Gemma RMSNorm computes x/rms * (1 + w): fold the 1 in, as the
        # GGUF converter does, so the forward below is shared.
        for layer in layers:
            for name in ("attn_norm", "ffn_norm", "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm"):
                setattr(layer, name, getattr(layer, name) + 1.0)
        final_norm = final_norm + 1.0
    lm_head = get("lm_head.weight", False)
    tied = lm_head is None or bool(c.get("tie_word_embeddings", False))
    model = Model(cfg, embed, layers, final_norm,
                  embed if tied else lm_head, tied=tied,
                  source={"kind": "hf", "path": os.path.abspath(path), "files": files})
    _check_shapes(model)
    return model


def _hf_gemma3_parts(c: dict, hidden: int, n_layers: int, head_dim: int) -> dict:
    """Gemma 3's Config fields from an HF config, as transformers'
    Gemma3TextModel reads them: embeddings times sqrt(hidden) (rounded to the
    weights' dtype there; exact for the sizes used here), attention scaled by
    query_pre_attn_scalar^-0.5, the GELU-tanh MLP, and the sliding layers from
    `layer_types` (else every `sliding_window_pattern`-th layer, default 6,
    is global) with their own RoPE base."""
    if c.get("attn_logit_softcapping") or c.get("final_logit_softcapping"):
        raise NotImplementedError("logit soft-capping (Gemma 2)")
    types = c.get("layer_types")
    if types is None:
        pattern = int(c.get("sliding_window_pattern", 6))
        types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layers)]
    if len(types) != n_layers or set(types) - {"full_attention", "sliding_attention"}:
        raise ValueError(f"layer_types {types}")
    local_theta = c.get("rope_local_base_freq")
    if local_theta is None:
        local_theta = ((c.get("rope_parameters") or {}).get("sliding_attention") or {}).get("rope_theta", 10000.0)
    return dict(
        embed_scale=math.sqrt(hidden),
        attn_scale=float(c.get("query_pre_attn_scalar", head_dim)) ** -0.5,
        mlp_act="gelu_tanh",
        sliding_window=int(c["sliding_window"]),
        sliding_layers=[t == "sliding_attention" for t in types],
        rope_local_theta=float(local_theta),
    )


def _check_shapes(m: Model):
    c = m.config
    H, q, kv, F = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
    assert c.num_heads % c.num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads"
    assert m.embed.shape[1] == H, m.embed.shape
    assert m.lm_head.shape[1] == H, m.lm_head.shape
    for i, L in enumerate(m.layers):
        for name, a, want in [("wq", L.wq, (q, H)), ("wk", L.wk, (kv, H)), ("wv", L.wv, (kv, H)),
                              ("wo", L.wo, (H, q)), ("w_gate", L.w_gate, (F, H)),
                              ("w_up", L.w_up, (F, H)), ("w_down", L.w_down, (H, F)),
                              ("attn_norm", L.attn_norm, (H,)), ("ffn_norm", L.ffn_norm, (H,))]:
            assert a.shape == want, f"layer {i} {name}: shape {a.shape}, expected {want}"
        if c.qk_norm:
            assert L.q_norm.shape == (c.head_dim,) and L.k_norm.shape == (c.head_dim,)


# --------------------------------------------------------------------------
# The forward pass
# --------------------------------------------------------------------------

def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    var = np.mean(x * x, axis=-1, keepdims=True)
    return w * (x / np.sqrt(var + eps))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (HF "gelu_pytorch_tanh")."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def rope_inv_freq(c: Config, theta: Optional[float] = None) -> np.ndarray:
    """HF's inv_freq (float64), including llama3/linear scaling.

    With `theta` given (Gemma 3's sliding layers): that base, no scaling.
    """
    d = c.head_dim
    if theta is not None:
        return 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    inv_freq = 1.0 / (c.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    rs = c.rope_scaling
    if rs:
        kind = rs.get("rope_type", rs.get("type", "default"))
        if kind == "llama3":
            factor = float(rs["factor"])
            lo = float(rs["low_freq_factor"])
            hi = float(rs["high_freq_factor"])
            old_ctx = float(rs["original_max_position_embeddings"])
            lo_wavelen = old_ctx / lo
            hi_wavelen = old_ctx / hi
            wavelen = 2 * math.pi / inv_freq
            scaled = np.where(wavelen > lo_wavelen, inv_freq / factor, inv_freq)
            smooth = (old_ctx / wavelen - lo) / (hi - lo)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = ~(wavelen < hi_wavelen) & ~(wavelen > lo_wavelen)
            inv_freq = np.where(medium, smoothed, scaled)
        elif kind == "linear":
            inv_freq = inv_freq / float(rs["factor"])
        elif kind not in ("default", None):
            raise NotImplementedError(f"rope scaling {kind}")
    if c.rope_freq_factors is not None:
        # llama.cpp: theta_i = pos * inv_freq_i / freq_factors_i
        inv_freq = inv_freq / c.rope_freq_factors.reshape(-1)
    return inv_freq


def rotate_half(x: np.ndarray) -> np.ndarray:
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


class KVCache:
    def __init__(self, n_layers: int):
        self.k = [None] * n_layers   # each [n_kv, T, head_dim]
        self.v = [None] * n_layers
        self.length = 0

    def append(self, i: int, k: np.ndarray, v: np.ndarray):
        if self.k[i] is None:
            self.k[i], self.v[i] = k, v
        else:
            self.k[i] = np.concatenate([self.k[i], k], axis=1)
            self.v[i] = np.concatenate([self.v[i], v], axis=1)
        return self.k[i], self.v[i]


class Forward:
    def __init__(self, model: Model):
        self.m = model
        self.c = model.config
        self.inv_freq = rope_inv_freq(self.c)
        self.inv_freq_local = (rope_inv_freq(self.c, self.c.rope_local_theta)
                               if self.c.rope_local_theta is not None else None)
        self.dtype = model.embed.dtype

    def rope_cos_sin(self, inv_freq: np.ndarray, pos: np.ndarray):
        freqs = np.outer(pos, inv_freq)                             # [T, hd/2]
        emb = np.concatenate([freqs, freqs], axis=-1)               # [T, hd]
        return np.cos(emb).astype(self.dtype), np.sin(emb).astype(self.dtype)

    def __call__(self, ids, cache: Optional[KVCache] = None) -> np.ndarray:
        """Run `ids` (new tokens) after whatever `cache` holds.

        Returns logits [len(ids), vocab] in the model dtype. Updates `cache`.
        """
        c, m = self.c, self.m
        ids = np.asarray(ids, dtype=np.int64)
        T = len(ids)
        start = cache.length if cache is not None else 0
        if cache is None:
            cache = KVCache(c.num_layers)
        pos = np.arange(start, start + T, dtype=np.float64)
        cos, sin = self.rope_cos_sin(self.inv_freq, pos)
        if self.inv_freq_local is not None:
            cos_local, sin_local = self.rope_cos_sin(self.inv_freq_local, pos)

        nh, nkv, hd = c.num_heads, c.num_kv_heads, c.head_dim
        group = nh // nkv
        scale = c.attn_scale if c.attn_scale is not None else 1.0 / math.sqrt(hd)
        S = start + T
        # causal mask over [T, S]: query t (absolute start+t) sees keys <= start+t
        q_pos = (start + np.arange(T))[:, None]
        k_pos = np.arange(S)[None, :]
        mask = k_pos > q_pos
        if c.sliding_window is not None:
            # sliding layers also hide keys at least `window` positions back
            mask_sliding = mask | (q_pos - k_pos >= c.sliding_window)

        x = m.embed[ids]                                            # [T, H]
        if c.embed_scale is not None:
            x = x * c.embed_scale
        for i, L in enumerate(m.layers):
            sliding = c.sliding_layers is not None and c.sliding_layers[i]
            h = rms_norm(x, L.attn_norm, c.rms_norm_eps)
            q = h @ L.wq.T
            k = h @ L.wk.T
            v = h @ L.wv.T
            if L.bq is not None: q = q + L.bq
            if L.bk is not None: k = k + L.bk
            if L.bv is not None: v = v + L.bv
            q = q.reshape(T, nh, hd)
            k = k.reshape(T, nkv, hd)
            v = v.reshape(T, nkv, hd)
            if L.q_norm is not None:
                q = rms_norm(q, L.q_norm, c.rms_norm_eps)
            if L.k_norm is not None:
                k = rms_norm(k, L.k_norm, c.rms_norm_eps)
            q = q.transpose(1, 0, 2)                                # [nh, T, hd]
            k = k.transpose(1, 0, 2)                                # [nkv, T, hd]
            v = v.transpose(1, 0, 2)
            if sliding:
                q = q * cos_local + rotate_half(q) * sin_local
                k = k * cos_local + rotate_half(k) * sin_local
            else:
                q = q * cos + rotate_half(q) * sin
                k = k * cos + rotate_half(k) * sin
            K, V = cache.append(i, k, v)                            # [nkv, S, hd]
            K = np.repeat(K, group, axis=0)                         # [nh, S, hd]
            V = np.repeat(V, group, axis=0)
            scores = (q @ K.transpose(0, 2, 1)) * scale             # [nh, T, S]
            scores = np.where((mask_sliding if sliding else mask)[None], -np.inf, scores)
            scores = scores - scores.max(axis=-1, keepdims=True)
            p = np.exp(scores)
            p = p / p.sum(axis=-1, keepdims=True)
            a = (p @ V).transpose(1, 0, 2).reshape(T, nh * hd)      # [T, nh*hd]
            o = a @ L.wo.T
            if L.bo is not None: o = o + L.bo
            if L.post_attn_norm is not None:
                o = rms_norm(o, L.post_attn_norm, c.rms_norm_eps)
            x = x + o
            h = rms_norm(x, L.ffn_norm, c.rms_norm_eps)
            act = gelu_tanh if c.mlp_act == "gelu_tanh" else silu
            f = (act(h @ L.w_gate.T) * (h @ L.w_up.T)) @ L.w_down.T
            if L.post_ffn_norm is not None:
                f = rms_norm(f, L.post_ffn_norm, c.rms_norm_eps)
            x = x + f
        cache.length = S
        self.last_cache = cache
        x = rms_norm(x, m.final_norm, c.rms_norm_eps)
        return x @ m.lm_head.T

    def greedy(self, prompt_ids, max_new: int, eos_id: Optional[int] = None):
        """Greedy decode with a KV cache. Returns (tokens, stopped_at_eos_index or None)."""
        cache = KVCache(self.c.num_layers)
        logits = self(prompt_ids, cache)[-1]
        out = []
        for step in range(max_new):
            t = int(np.argmax(logits))
            out.append(t)
            if eos_id is not None and t == eos_id:
                return out, step
            if step + 1 < max_new:
                logits = self(np.array([t]), cache)[-1]
        return out, None


def load(gguf: Optional[str] = None, hf_dir: Optional[str] = None, dtype=np.float64) -> Model:
    if (gguf is None) == (hf_dir is None):
        raise ValueError("give exactly one of gguf / hf_dir")
    return load_gguf(gguf, dtype) if gguf else load_hf_dir(hf_dir, dtype)


# --------------------------------------------------------------------------
# CLI: quick sanity check
# --------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--gguf", help="GGUF file")
    src.add_argument("--hf-dir", help="HF directory (config.json + safetensors)")
    ap.add_argument("--prompt-ids", help="comma-separated token ids")
    ap.add_argument("--chat", help="user message; rendered with the GGUF's chat template via transformers")
    ap.add_argument("--text", help="raw text; tokenized with the GGUF tokenizer via transformers")
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    ap.add_argument("--compare-transformers", action="store_true",
                    help="also run the prompt through transformers (needs torch, and accelerate "
                         "for GGUF) and report the largest logit difference")
    args = ap.parse_args(argv)
    dtype = np.float64 if args.dtype == "float64" else np.float32

    t0 = time.time()
    model = load(args.gguf, args.hf_dir, dtype)
    print(f"loaded {model.source['kind']} in {time.time() - t0:.1f}s: {model.config.arch}, "
          f"{model.config.num_layers} layers, hidden {model.config.hidden_size}, "
          f"heads {model.config.num_heads}/{model.config.num_kv_heads}x{model.config.head_dim}, "
          f"tied={model.tied}, dtype={args.dtype}", file=sys.stderr)

    tok = None
    if args.chat is not None or args.text is not None:
        if not args.gguf:
            ap.error("--chat/--text need --gguf (the tokenizer comes from the GGUF)")
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(args.gguf)),
                                            gguf_file=os.path.basename(args.gguf))
        if args.chat is not None:
            text = tok.apply_chat_template([{"role": "user", "content": args.chat}],
                                           add_generation_prompt=True, tokenize=False)
        else:
            text = args.text
        ids = tok.encode(text, add_special_tokens=False)
    elif args.prompt_ids:
        ids = [int(s) for s in args.prompt_ids.split(",") if s.strip()]
    else:
        ap.error("give --prompt-ids, --chat or --text")

    fwd = Forward(model)
    t0 = time.time()
    out, eos_at = fwd.greedy(ids, args.max_new, model.config.eos_token_id)
    dt = time.time() - t0
    print(f"prompt ids ({len(ids)}): {ids}")
    print(f"greedy ids ({len(out)}{', EOS at %d' % eos_at if eos_at is not None else ''}): {out}")
    if tok is not None:
        print("greedy text:", repr(tok.decode(out, skip_special_tokens=False)))
    print(f"generation took {dt:.1f}s", file=sys.stderr)

    if args.compare_transformers:
        ours = fwd(ids)
        theirs = transformers_logits(args.gguf, args.hf_dir, ids)
        diff = np.abs(ours - theirs)
        agree = (ours.argmax(-1) == theirs.argmax(-1)).mean()
        print(f"vs transformers: max |logit diff| {diff.max():.3g} over {len(ids)} positions "
              f"(max |logit| {np.abs(ours).max():.3g}); argmax agreement {agree:.0%}")


def transformers_logits(gguf_path, hf_dir, ids) -> np.ndarray:
    """Logits for `ids` from transformers itself (a cross-check, not used for fixtures).

    HF directories load in float64; GGUF checkpoints load in float32 (that is
    how transformers' GGUF kernels compute), so expect ~1e-5 relative error there.
    """
    import torch
    from transformers import AutoModelForCausalLM
    if gguf_path:
        m = AutoModelForCausalLM.from_pretrained(os.path.dirname(os.path.abspath(gguf_path)),
                                                 gguf_file=os.path.basename(gguf_path),
                                                 dtype=torch.float32)
    else:
        m = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float64)
    m.eval()
    with torch.no_grad():
        return m(torch.tensor([list(ids)])).logits[0].double().numpy()


if __name__ == "__main__":
    main()
