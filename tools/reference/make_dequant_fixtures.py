#!/usr/bin/env python3
"""Generate the dequantization / GGUF-reader test fixtures for spindle-engine.

The expected values come from the `gguf` Python package (an independent
implementation of ggml's formats), pinned in requirements.txt:

    python -m venv /tmp/refvenv && /tmp/refvenv/bin/pip install -r tools/reference/requirements.txt
    /tmp/refvenv/bin/python tools/reference/make_dequant_fixtures.py [--model PATH]

Writes, under engine/tests/fixtures/dequant/:

* dequant_fixtures.json: for every supported type, a few blocks of seeded
  random bytes (f16 scale fields replaced by finite f16 values, so there is no
  NaN/inf) as hex, and the f32 values `gguf.quants.dequantize` gives.
* smollm2_q4_1.json (only when the model is found, via --model or the
  SPINDLE_MODEL_GGUF environment variable): header fields and the first
  dequantized values of a few tensors, as read by `gguf.GGUFReader`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

SEED = 20240611
REPO = Path(__file__).resolve().parents[2]
OUT_DIR = REPO / "engine" / "tests" / "fixtures" / "dequant"

# type -> (number of blocks, byte offsets of f16 scale fields within a block)
QUANT_TYPES: dict[T, tuple[int, list[int]]] = {
    T.Q4_0: (4, [0]),
    T.Q4_1: (4, [0, 2]),
    T.Q8_0: (4, [0]),
    T.Q4_K: (2, [0, 2]),
    T.Q5_K: (2, [0, 2]),
    T.Q6_K: (2, [208]),
    # Appended (not inserted) so the cases above keep their random bytes.
    T.Q5_0: (4, [0]),
    T.Q5_1: (4, [0, 2]),
}
FLOAT_ELEMENTS = 64


def finite_bits(rng: np.random.Generator, n: int, exp_shift: int, exp_mask: int, bits: int) -> np.ndarray:
    """Random `bits`-wide patterns whose exponent field is never all ones."""
    dtype = np.uint16 if bits == 16 else np.uint32
    x = rng.integers(0, 1 << bits, size=n, dtype=np.uint64).astype(dtype)
    bad = ((x >> exp_shift) & exp_mask) == exp_mask
    x[bad] &= dtype(~(1 << exp_shift) & ((1 << bits) - 1))  # clear the exponent's low bit
    return x


def sane_f16(rng: np.random.Generator, block: int) -> bytes:
    """A finite f16: a realistic scale in early blocks, any finite value in the last."""
    if block == 0:
        v = np.float16(rng.uniform(1e-3, 0.1) * rng.choice([-1.0, 1.0]))
    elif block == 1:
        v = np.float16(rng.uniform(1e-4, 0.05))
    else:
        v = finite_bits(rng, 1, 10, 0x1F, 16).view(np.float16)[0]
    return np.array([v], dtype=np.float16).tobytes()


def quant_case(rng: np.random.Generator, qtype: T, n_blocks: int, scale_offsets: list[int]) -> dict:
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = []
    for b in range(n_blocks):
        raw = bytearray(rng.integers(0, 256, size=type_size, dtype=np.uint8).tobytes())
        for off in scale_offsets:
            raw[off : off + 2] = sane_f16(rng, b)
        blocks.append(bytes(raw))
    data = b"".join(blocks)
    return case(qtype, data, n_blocks * block_size)


def float_case(rng: np.random.Generator, qtype: T) -> dict:
    n = FLOAT_ELEMENTS
    if qtype == T.F32:
        data = finite_bits(rng, n, 23, 0xFF, 32).astype("<u4").tobytes()
    elif qtype == T.F16:
        data = finite_bits(rng, n, 10, 0x1F, 16).astype("<u2").tobytes()
    else:  # BF16
        data = finite_bits(rng, n, 7, 0xFF, 16).astype("<u2").tobytes()
    return case(qtype, data, n)


def case(qtype: T, data: bytes, n_elements: int) -> dict:
    values = dequantize(np.frombuffer(data, dtype=np.uint8), qtype).astype(np.float32).ravel()
    assert values.size == n_elements, (qtype, values.size, n_elements)
    assert np.all(np.isfinite(values)), qtype
    return {
        "type": qtype.name,
        "type_id": int(qtype.value),
        "n_elements": n_elements,
        "bytes_hex": data.hex(),
        "values": [float(v) for v in values],
    }


def make_dequant_fixture() -> dict:
    rng = np.random.default_rng(SEED)
    cases = [float_case(rng, t) for t in (T.F32, T.F16, T.BF16)]
    cases += [quant_case(rng, t, n, offs) for t, (n, offs) in QUANT_TYPES.items()]
    return {
        "generator": "tools/reference/make_dequant_fixtures.py",
        "reference": f"gguf=={gguf_version()} numpy=={np.__version__} gguf.quants.dequantize",
        "seed": SEED,
        "cases": cases,
    }


def gguf_version() -> str:
    from importlib.metadata import version

    return version("gguf")


def tensor_expectation(reader: gguf.GGUFReader, name: str) -> dict:
    t = next(t for t in reader.tensors if t.name == name)
    values = dequantize(t.data, t.tensor_type).astype(np.float32)
    shape = [int(d) for d in reversed(t.shape.tolist())]  # outermost first
    values = values.reshape(shape) if len(shape) > 1 else values
    flat = values.ravel()
    row1 = values[1][:8] if len(shape) > 1 else flat[:0]
    return {
        "name": name,
        "type": t.tensor_type.name,
        "shape": shape,
        "offset": int(t.data_offset),
        "size": int(t.n_bytes),
        "first8": [float(v) for v in flat[:8]],
        "row1_first8": [float(v) for v in row1],
        "last8": [float(v) for v in flat[-8:]],
    }


def make_model_fixture(path: Path) -> dict:
    r = gguf.GGUFReader(path)
    f = r.fields
    tensors = ["blk.0.attn_q.weight", "token_embd.weight", "blk.0.attn_norm.weight"]
    return {
        "generator": "tools/reference/make_dequant_fixtures.py",
        "reference": f"gguf=={gguf_version()} GGUFReader",
        "file": path.name,
        "version": int(f["GGUF.version"].contents()),
        "tensor_count": len(r.tensors),
        "alignment": int(r.alignment),
        "data_offset": int(r.data_offset),
        "architecture": f["general.architecture"].contents(),
        "block_count": int(f["llama.block_count"].contents()),
        "embedding_length": int(f["llama.embedding_length"].contents()),
        "rope_freq_base": float(f["llama.rope.freq_base"].contents()),
        "rms_eps": float(f["llama.attention.layer_norm_rms_epsilon"].contents()),
        "token_count": len(f["tokenizer.ggml.tokens"].data),
        "first_tokens": f["tokenizer.ggml.tokens"].contents(slice(0, 4)),
        "merges_count": len(f["tokenizer.ggml.merges"].data),
        "tensors": [tensor_expectation(r, n) for n in tensors],
    }


def write_json(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1) + "\n")
    print(f"wrote {path.relative_to(REPO)} ({path.stat().st_size} bytes)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=os.environ.get("SPINDLE_MODEL_GGUF"),
                    help="SmolLM2-135M-Instruct.Q4_1.gguf (default: $SPINDLE_MODEL_GGUF)")
    args = ap.parse_args()
    write_json(OUT_DIR / "dequant_fixtures.json", make_dequant_fixture())
    if args.model and Path(args.model).is_file():
        write_json(OUT_DIR / "smollm2_q4_1.json", make_model_fixture(Path(args.model)))
    else:
        print(f"model not found ({args.model!r}); smollm2_q4_1.json left as is", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
