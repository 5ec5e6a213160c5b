#!/usr/bin/env python3
"""Aggregate output tok/s of llama.cpp's llama-server at several concurrency
levels, closed loop, with the same token-id prompts and output lengths as
`sched-throughput` (dump them with SPINDLE_DUMP_PROMPTS=prompts.json).

    llama-server -m SmolLM2-135M-Instruct.Q4_1.gguf -t 2 -np 64 -c 16384 --port 8099 &
    python3 benches/scripts/llama_server_throughput.py prompts.json 1,4,16,64 16 64 http://127.0.0.1:8099

Only loopback targets are used. Standard library only.
"""
import http.client
import json
import sys
import threading
import time
import urllib.parse


def run_one(url, prompt, n_predict):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps({"prompt": prompt, "n_predict": n_predict, "ignore_eos": True,
                       "temperature": 0.0, "cache_prompt": True})
    conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
    resp = json.loads(conn.getresponse().read())
    conn.close()
    return resp.get("tokens_predicted", 0)


def main():
    prompts = json.load(open(sys.argv[1]))
    levels = [int(x) for x in sys.argv[2].split(",")]
    per_level = int(sys.argv[3])
    n_predict = int(sys.argv[4])
    url = sys.argv[5]
    assert urllib.parse.urlparse(url).hostname in ("127.0.0.1", "localhost"), "loopback only"
    print("| concurrency | requests | output tok/s | wall s |")
    print("| --- | --- | --- | --- |")
    for li, c in enumerate(levels):
        work = list(prompts[li * per_level:(li + 1) * per_level])
        lock = threading.Lock()
        total = [0]

        def worker():
            while True:
                with lock:
                    if not work:
                        return
                    p = work.pop()
                n = run_one(url, p, n_predict)
                with lock:
                    total[0] += n

        start = time.monotonic()
        threads = [threading.Thread(target=worker) for _ in range(c)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - start
        print(f"| {c} | {per_level} | {total[0] / wall:.1f} | {wall:.1f} |")


if __name__ == "__main__":
    main()
