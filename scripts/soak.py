#!/usr/bin/env python3
"""Soak test for a running `spindle serve` (not part of CI; minutes long).

Sends N streamed requests at a given concurrency, mixing clients that read
to the end, clients that disconnect after a few events, slow readers, and
background responses that are cancelled; then checks that the daemon went
back to where it started: every KV block free, no stored response it
created left `queued`/`in_progress`, open file descriptors back to the
baseline, and reports resident memory before and after.

    target/release/spindle serve &
    .venv-py/bin/python scripts/soak.py --pid $!

Exit status 0 when every check passes.
"""

import argparse
import asyncio
import os
import random
import re
import sys
import time

import httpx2 as httpx  # the HTTP client the OpenAI SDK installs (tests/python/requirements.txt)


def proc_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def proc_rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def metric(text, name):
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


async def one(client, rng, kind, counts, stored):
    body = {"input": rng.choice(["Tell me a story.", "List ten animals.", "Explain rain.", "Write a poem about tea."]),
            "max_output_tokens": rng.randint(16, 64), "stream": kind != "cancel"}
    try:
        if kind == "cancel":
            body.update(background=True, store=True, max_output_tokens=512, ignore_eos=True)
            r = await client.post("/v1/responses", json=body)
            rid = r.json()["id"]
            stored.append(rid)
            await asyncio.sleep(rng.uniform(0.05, 1.0))
            await client.post(f"/v1/responses/{rid}/cancel")
        else:
            body["store"] = rng.random() < 0.5
            async with client.stream("POST", "/v1/responses", json=body) as r:
                events = 0
                async for line in r.aiter_lines():
                    events += 1
                    if body["store"] and events <= 3 and line.startswith("data: ") and '"response.created"' in line:
                        stored.append(re.search(r'"id":"(resp_[0-9a-f]+)"', line).group(1))
                    if kind == "disconnect" and events > rng.randint(2, 30):
                        break
                    if kind == "slow":
                        await asyncio.sleep(0.05)
        counts[kind] = counts.get(kind, 0) + 1
    except httpx.HTTPError as e:
        counts["errors"] = counts.get("errors", 0) + 1
        counts.setdefault("error_kinds", set()).add(type(e).__name__)


async def run(args):
    rng = random.Random(args.seed)
    kinds = ["full"] * 60 + ["disconnect"] * 15 + ["slow"] * 10 + ["cancel"] * 15
    limits = httpx.Limits(max_connections=args.concurrency)
    async with httpx.AsyncClient(base_url=args.base_url, timeout=300, limits=limits) as client:
        fds0, rss0 = proc_fds(args.pid), proc_rss_mib(args.pid)
        sem = asyncio.Semaphore(args.concurrency)
        counts, stored = {}, []

        async def bounded(i):
            async with sem:
                await one(client, random.Random(args.seed * 100003 + i), rng.choice(kinds), counts, stored)

        started = time.time()
        await asyncio.gather(*(bounded(i) for i in range(args.requests)))
        took = time.time() - started
        deadline = time.time() + 120
        while True:
            text = (await client.get("/metrics")).text
            used, running = metric(text, "spindle_kv_blocks_used"), metric(text, "spindle_running_sequences")
            if used == 0 and running == 0 or time.time() > deadline:
                break
            await asyncio.sleep(0.5)
        statuses = {}
        for rid in stored:
            status = (await client.get(f"/v1/responses/{rid}")).json().get("status")
            statuses[status] = statuses.get(status, 0) + 1
    await asyncio.sleep(2)  # let closed sockets go
    fds1, rss1 = proc_fds(args.pid), proc_rss_mib(args.pid)
    unfinished = statuses.get("queued", 0) + statuses.get("in_progress", 0) + statuses.get(None, 0)
    print(f"{args.requests} requests at concurrency {args.concurrency} in {took:.0f} s: {counts}")
    print(f"KV blocks used after: {used}; running: {running}; stored responses by status: {statuses}")
    print(f"open fds: {fds0} before, {fds1} after; RSS: {rss0:.0f} MiB before, {rss1:.0f} MiB after")
    ok = used == 0 and running == 0 and unfinished == 0 and fds1 <= fds0 + 4
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8080")
    p.add_argument("--pid", type=int, required=True, help="the daemon's process id (for fds and RSS)")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--seed", type=int, default=1)
    sys.exit(asyncio.run(run(p.parse_args())))


if __name__ == "__main__":
    main()
