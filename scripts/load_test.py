#!/usr/bin/env python
"""Load test for `pipkie serve`: many concurrent clients, requests/s and latency percentiles.

    python scripts/load_test.py                      # start a server (shipped model, else a tiny random
                                                     # one built here), 50 clients x 10 requests, stop it
    python scripts/load_test.py --url http://127.0.0.1:8000     # an already running server
    python scripts/load_test.py --model models/pipkie-sroie --clients 20 --requests 5 --json result.json

Requests are JSON words (SROIE box files from ../shared/data/sroie/{test,train}/box when present,
else a synthetic receipt), so the figures measure the service and the model, not OCR
(`--payload text` sends plain text instead). The run is bounded: `--deadline` seconds for all
requests (unfinished ones are counted as failures), then the server it started is stopped.
Prints one JSON summary: requests, failures by kind, wall time, requests/s, latency p50/p90/p99/max
(successful requests), and the server's batching counters (documents per model call).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
SROIE = ROOT.parent / "shared" / "data" / "sroie"


def build_tiny_model(directory: Path) -> Path:
    """A random 2-layer pipkie model (as in the tests): answers are noise, speed is the point."""
    import torch
    from transformers import AutoModelForCausalLM

    from pipkie.modeling import Settings, add_tokens_to_model, compact_config
    from pipkie.template import SPECIAL_TOKENS
    from pipkie.train.tokenizer import train_tokenizer

    texts = ["TOTAL RM 85.54 PETRODELI ENTERPRISE 26/02/18 LOT 485 JALAN company date address total unknown : \n"] * 8
    tok = train_tokenizer(texts + payload_texts(50), vocab_size=500, special=list(SPECIAL_TOKENS))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(compact_config(len(tok), "qwen2", hidden=64, layers=2, heads=4, ffn=128))
    add_tokens_to_model(model, tok)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    Settings(keys=["company", "date", "address", "total"], budgets={"company": 8, "date": 6, "address": 12, "total": 5},
             max_length=1024).save(directory)
    return directory


def box_files(n: int) -> list[Path]:
    files: list[Path] = []
    for split in ("test", "train"):
        files += sorted((SROIE / split / "box").glob("*.txt"))[: n - len(files)]
    return files


def words_payload(path: Path) -> dict:
    words = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.split(",", 8)
        if len(parts) == 9 and parts[8].strip():
            try:
                words.append({"text": parts[8].strip(), "box": [int(float(v)) for v in parts[:8]]})
            except ValueError:
                continue
    xs = [v for w in words for v in w["box"][0::2]] or [1000]
    ys = [v for w in words for v in w["box"][1::2]] or [1000]
    return {"id": path.stem, "words": words, "page_sizes": [[max(xs) + 10, max(ys) + 10]]}


def synthetic_payload(i: int) -> dict:
    lines = ["ACME TRADING SDN BHD", "NO 7 JALAN MAIN 54200 KUALA LUMPUR", f"DATE 1{i % 10}/03/2019",
             "ITEM A 2 X 3.50", "ITEM B 1 X 2.90", f"TOTAL RM {9 + i % 7}.90", "THANK YOU"]
    words = [{"text": t, "box": [50 + 60 * j, 40 + 60 * r, 100 + 60 * j, 80 + 60 * r]}
             for r, line in enumerate(lines) for j, t in enumerate(line.split())]
    return {"id": f"synthetic{i}", "words": words}


def payloads(n: int, kind: str) -> list[dict]:
    files = box_files(n)
    docs = [words_payload(p) for p in files] if files else [synthetic_payload(i) for i in range(n)]
    if kind == "text":
        docs = [{"id": d["id"], "text": "\n".join(w["text"] for w in d["words"])} for d in docs]
    return docs


def payload_texts(n: int) -> list[str]:
    return [" ".join(w["text"] for w in p["words"]) for p in payloads(n, "words")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, port: int, args) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pipkie.cli", "serve", "--host", "127.0.0.1", "--port", str(port), "--model", model,
           "--threads", str(args.threads), "--max-batch", str(args.max_batch), "--max-wait-ms", str(args.max_wait_ms),
           "--timeout", str(args.request_timeout)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    log = tempfile.TemporaryFile(mode="w+")  # not a pipe: a full pipe would block the server
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    proc.log = log
    return proc


def wait_healthy(url: str, proc: subprocess.Popen | None, timeout: float) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            proc.log.seek(0)
            raise SystemExit(f"server exited ({proc.returncode}): {proc.log.read()[-2000:]}")
        try:
            r = httpx.get(f"{url}/health", timeout=2)
            if r.status_code == 200 and r.json().get("status") == "ok":
                return r.json()
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"server at {url} not healthy after {timeout:.0f} s")


async def client_loop(client: httpx.AsyncClient, url: str, docs: list[dict], offset: int, n: int, keys, out: list):
    for i in range(n):
        body = {**docs[(offset + i) % len(docs)], "keys": keys}
        t0 = time.perf_counter()
        try:
            r = await client.post(f"{url}/extract", json=body)
            out.append((r.status_code, time.perf_counter() - t0, None if r.status_code == 200 else r.text[:200]))
        except httpx.HTTPError as e:
            out.append((type(e).__name__, time.perf_counter() - t0, str(e)[:200]))


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[k]


async def run_load(url: str, args) -> dict:
    docs = payloads(args.documents, args.payload)
    keys = args.keys.split(",") if args.keys else None
    results: list = []
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(timeout=args.request_timeout + 10, limits=limits) as client:
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(client_loop(client, url, docs, c * args.requests, args.requests, keys, results))
                 for c in range(args.clients)]
        done, pending = await asyncio.wait(tasks, timeout=args.deadline)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        wall = time.perf_counter() - t0
    total = args.clients * args.requests
    ok = [lat for status, lat, _ in results if status == 200]
    failures = Counter(str(status) for status, _, _ in results if status != 200)
    if len(results) < total:
        failures["unfinished (deadline)"] = total - len(results)
    examples = sorted({msg for status, _, msg in results if status != 200 and msg})[:3]
    ms = lambda v: None if v is None else round(v * 1000, 1)  # noqa: E731
    return {
        "url": url, "payload": args.payload, "documents": len(docs), "clients": args.clients,
        "requests_per_client": args.requests, "requests": total, "succeeded": len(ok),
        "failures": dict(failures), "failure_examples": examples, "wall_s": round(wall, 2),
        "requests_per_s": round(len(ok) / wall, 2) if wall else None,
        "latency_ms": {"p50": ms(percentile(ok, 50)), "p90": ms(percentile(ok, 90)), "p99": ms(percentile(ok, 99)),
                       "max": ms(max(ok) if ok else None), "mean": ms(statistics.fmean(ok) if ok else None)},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="an already running server (default: start one on a free port)")
    ap.add_argument("--model", help="model directory for the server started here (default: models/pipkie-sroie, "
                                    "else a tiny random model)")
    ap.add_argument("--tiny", action="store_true", help="use a tiny random model even if the shipped one exists")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--requests", type=int, default=10, help="requests per client, one after the other")
    ap.add_argument("--documents", type=int, default=20, help="distinct documents cycled through")
    ap.add_argument("--payload", choices=("words", "text"), default="words")
    ap.add_argument("--keys", default=None, help="comma-separated keys (default: the model's)")
    ap.add_argument("--deadline", type=float, default=300, help="seconds for the whole run")
    ap.add_argument("--request-timeout", type=float, default=60)
    ap.add_argument("--threads", type=int, default=1, help="server torch/OCR threads")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--max-wait-ms", type=float, default=10)
    ap.add_argument("--json", dest="json_path", help="also write the summary here")
    args = ap.parse_args(argv)

    proc, tmp = None, None
    url = args.url.rstrip("/") if args.url else None
    try:
        if url is None:
            model = args.model
            shipped = ROOT / "models" / "pipkie-sroie"
            if model is None and not args.tiny and (shipped / "pipkie.json").exists():
                model = str(shipped)
            if model is None:
                tmp = tempfile.TemporaryDirectory(prefix="pipkie-load-")
                model = str(build_tiny_model(Path(tmp.name) / "tiny"))
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            proc = start_server(model, port, args)
        health = wait_healthy(url, proc, timeout=180)
        summary = asyncio.run(run_load(url, args))
        after = httpx.get(f"{url}/health", timeout=10).json()
        batching = after.get("batching", {})
        calls = batching.get("model_calls") or 0
        summary["server"] = {"model": health.get("model"), "limits": health.get("limits"), "batching": batching,
                             "documents_per_model_call": round(batching.get("documents", 0) / calls, 2) if calls else None}
        print(json.dumps(summary, indent=2))
        if args.json_path:
            Path(args.json_path).write_text(json.dumps(summary, indent=2) + "\n")
        return 0 if summary["succeeded"] == summary["requests"] else 1
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
