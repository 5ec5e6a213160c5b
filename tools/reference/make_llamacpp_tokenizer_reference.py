#!/usr/bin/env python3
"""Reference token ids from llama.cpp's own tokenizer, for GGUF vocabularies
that transformers cannot convert offline (SentencePiece ones such as Gemma 3).

Start llama.cpp's server on the GGUF (built from the `llama-cpp-python`
source package, see the README), then run this script against it; it asks
`POST /tokenize` (with BOS, special-token text parsed) for every string in
STRINGS and writes a JSON fixture: `{"source", "cases": [{"text", "ids"}]}`.

    llama-server -m gemma-3-270m-q4_k_m.gguf --port 8400 -t 1 &
    python3 tools/reference/make_llamacpp_tokenizer_reference.py \\
        --url http://127.0.0.1:8400 --source "llama.cpp b..." \\
        --out engine/tests/fixtures/tokenizer/gemma3_llamacpp.json

Standard library only.
"""

from __future__ import annotations

import argparse
import json
import urllib.request

STRINGS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "   leading and trailing spaces   ",
    "multiple    spaces\tand\ttabs\n\nnewlines\r\nend",
    "12345 and 3.14159, 1e-9, 0x1F",
    "Année, naïve café, Straße, Ελληνικά, русский",
    "你好，世界！这是一个测试。",
    "日本語のテキストとカタカナ",
    "emoji: 😀🎉👍🏽 family: 👨\u200d👩\u200d👧\u200d👦",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n",
    "fn main() {\n\tlet x: Vec<u32> = vec![1, 2, 3];\n}",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "I'm sure they'll say it's fine, we've done it.",
    "<table><tr><td>cell</td></tr></table>",
    "\n\n\n\n\n    \t\t  x",
    "unbelievably antidisestablishmentarianism pneumonoultramicroscopic",
    "a\u0000b\u0007c",
    "https://example.com/path?q=1&r=%20#frag",
    " ",
    "▁ already has a mark",
]


def tokenize(url: str, text: str) -> list[int]:
    body = json.dumps({"content": text, "add_special": True}).encode()
    req = urllib.request.Request(f"{url}/tokenize", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.load(resp)["tokens"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--source", required=True, help="which llama.cpp and which GGUF (recorded in the fixture)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cases = [{"text": s, "ids": tokenize(args.url, s)} for s in STRINGS]
    with open(args.out, "w", encoding="utf-8") as f:
        head = {"source": args.source, "add_bos": True}
        f.write(json.dumps(head, ensure_ascii=False)[:-1] + ', "cases": [\n')
        f.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n]}\n")


if __name__ == "__main__":
    main()
