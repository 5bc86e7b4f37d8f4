#!/usr/bin/env python
"""Load test, soak and hostile probes for `pipkie serve`.

    python scripts/load_test.py                      # start a server (shipped model, else a tiny random
                                                     # one built here), 50 clients x 10 requests, stop it
    python scripts/load_test.py --url http://127.0.0.1:8000     # an already running server
    python scripts/load_test.py --clients 10 --requests 3 --json result.json
    python scripts/load_test.py --soak 1800 --rate 0.3 --json soak.json     # 30 min at 0.3 requests/s
    python scripts/load_test.py --probes --json probes.json                 # the three probes of issue 15

Requests are JSON words (SROIE box files from ../shared/data/sroie/{test,train}/box when present,
else a synthetic receipt), so the figures measure the service and the model, not OCR. Each request
states its deadline (`--request-timeout`, sent as X-Request-Timeout and passed to the server it
starts as --timeout; the probes send none, as issue 15's clients did). The service
answers what it cannot do in time with 503 at once, so the load test checks the contract: every
request either succeeds within its deadline or is refused (503) within 1 s; `violations` counts
the others. A refused client goes on with its next request (`--honour-retry-after` waits first).

Summary (one JSON object): requests, successes, rejections (503), failures by kind, goodput
(successes/s), latency p50/p90/p99/max of successes and of rejections, violations, the server's
batching counters. `--soak` sends requests at a fixed rate (open loop) for that many seconds and
samples the server's RSS (`process_resident_memory_bytes` from /metrics): growth after `--warmup-s`.
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
import zlib
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
SROIE = ROOT.parent / "shared" / "data" / "sroie"
SAMPLE = ROOT / "samples" / "receipt.jpg"
REJECT_WITHIN_S = 1.0


def build_tiny_model(directory: Path) -> Path:
    """A random 2-layer pipkie model (as in the tests): answers are noise, speed is the point."""
    import torch
    from transformers import AutoModelForCausalLM

    from pipkie.model.modeling import Settings, add_tokens_to_model, compact_config
    from pipkie.model.template import SPECIAL_TOKENS
    from pipkie.train.tokenizer import train_tokenizer

    texts = ["TOTAL RM 85.54 PETRODELI ENTERPRISE 26/02/18 LOT 485 JALAN company date address total unknown : \n"] * 8
    tok = train_tokenizer(texts + payload_texts(50), vocab_size=500, special=list(SPECIAL_TOKENS))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(compact_config(len(tok), "qwen2", hidden=64, layers=2, heads=4, ffn=128))
    add_tokens_to_model(model, tok)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    Settings(
        keys=["company", "date", "address", "total"],
        budgets={"company": 8, "date": 6, "address": 12, "total": 5},
        max_length=1024,
    ).save(directory)
    return directory


# ---- payloads -----------------------------------------------------------------------------------
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
    lines = [
        "ACME TRADING SDN BHD",
        "NO 7 JALAN MAIN 54200 KUALA LUMPUR",
        f"DATE 1{i % 10}/03/2019",
        "ITEM A 2 X 3.50",
        "ITEM B 1 X 2.90",
        f"TOTAL RM {9 + i % 7}.90",
        "THANK YOU",
    ]
    words = [
        {"text": t, "box": [50 + 60 * j, 40 + 60 * r, 100 + 60 * j, 80 + 60 * r]}
        for r, line in enumerate(lines)
        for j, t in enumerate(line.split())
    ]
    return {"id": f"synthetic{i}", "words": words}


def payloads(n: int, kind: str) -> list[dict]:
    files = box_files(n)
    docs = [words_payload(p) for p in files] if files else [synthetic_payload(i) for i in range(n)]
    if kind == "text":
        docs = [{"id": d["id"], "text": "\n".join(w["text"] for w in d["words"])} for d in docs]
    return docs


def payload_texts(n: int) -> list[str]:
    return [" ".join(w["text"] for w in p["words"]) for p in payloads(n, "words")]


def one_line_payload(n: int) -> dict:
    """`n` words on one line (the reading-order probe)."""
    return {"id": f"line{n}", "words": [{"text": f"W{i}", "box": [i % 990, 500, i % 990 + 8, 512]} for i in range(n)]}


def bomb_png(width: int = 12000, height: int = 12000) -> bytes:
    """A valid all-black grey PNG of width x height: a few hundred KB that decode to width*height bytes."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")

    z, row, idat = zlib.compressobj(9), bytes(width + 1), []
    for _ in range(height):
        idat.append(z.compress(row))
    idat.append(z.flush())
    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 0, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"".join(idat)) + chunk(b"IEND", b"")


# ---- the server ---------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, port: int, args) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "pipkie.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        model,
        "--threads",
        str(args.threads),
        "--max-batch",
        str(args.max_batch),
        "--max-wait-ms",
        str(args.max_wait_ms),
        "--timeout",
        str(args.request_timeout),
    ]
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


def server_rss_mb(url: str) -> float | None:
    try:
        for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
            if line.startswith("process_resident_memory_bytes "):
                return float(line.split()[1]) / 2**20
    except httpx.HTTPError:
        return None
    return None


# ---- measuring ----------------------------------------------------------------------------------
async def post(client: httpx.AsyncClient, url: str, out: list, **kw) -> httpx.Response | None:
    """One request; appends (status or error name, seconds, message) to `out`."""
    t0 = time.perf_counter()
    try:
        r = await client.post(f"{url}/extract", **kw)
        out.append((r.status_code, time.perf_counter() - t0, None if r.status_code == 200 else r.text[:200]))
        return r
    except httpx.HTTPError as e:
        out.append((type(e).__name__, time.perf_counter() - t0, str(e)[:200]))
        return None


async def client_loop(client, url, docs, offset, n, keys, out, honour_retry_after, deadline_s, stop_at=None):
    for i in range(n):
        if stop_at is not None and time.perf_counter() >= stop_at:  # the run's --deadline: send no more
            return
        r = await post(
            client,
            url,
            out,
            json={**docs[(offset + i) % len(docs)], "keys": keys},
            headers={"X-Request-Timeout": f"{deadline_s:g}"},
        )
        if honour_retry_after and r is not None and r.status_code == 503:
            await asyncio.sleep(float(r.headers.get("retry-after", "1")))


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))]


def summarize(results: list, total: int, wall: float, deadline_s: float) -> dict:
    ok = [lat for status, lat, _ in results if status == 200]
    rejected = [lat for status, lat, _ in results if status == 503]
    failures = Counter(str(status) for status, _, _ in results if status not in (200, 503))
    not_sent = total - len(results)  # only with --deadline: requests a client had not started by then
    ms = lambda v: None if v is None else round(v * 1000, 1)  # noqa: E731
    lat = lambda v: {f"p{q}": ms(percentile(v, q)) for q in (50, 90, 99)} | {"max": ms(max(v) if v else None)}  # noqa: E731
    return {
        "requests": total,
        "not_sent": not_sent,
        "succeeded": len(ok),
        "rejected_503": len(rejected),
        "failures": dict(failures),
        "failure_examples": sorted({m for s, _, m in results if s not in (200, 503) and m})[:3],
        "violations": {
            "success_after_deadline": sum(v > deadline_s for v in ok),
            "rejection_after_1s": sum(v > REJECT_WITHIN_S for v in rejected),
            "other_failures": sum(failures.values()),
        },
        "wall_s": round(wall, 2),
        "goodput_per_s": round(len(ok) / wall, 3) if wall else None,
        "latency_ms": lat(ok) | {"mean": ms(statistics.fmean(ok) if ok else None)},
        "rejection_latency_ms": lat(rejected),
    }


async def run_load(url: str, args) -> dict:
    docs = payloads(args.documents, args.payload)
    keys = args.keys.split(",") if args.keys else None
    results: list = []
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(timeout=args.request_timeout + 10, limits=limits) as client:
        t0 = time.perf_counter()
        stop_at = t0 + args.deadline if args.deadline else None  # requests in flight always finish
        await asyncio.gather(
            *(
                client_loop(
                    client,
                    url,
                    docs,
                    c * args.requests,
                    args.requests,
                    keys,
                    results,
                    args.honour_retry_after,
                    args.request_timeout,
                    stop_at,
                )
                for c in range(args.clients)
            )
        )
        wall = time.perf_counter() - t0
    return {
        "url": url,
        "payload": args.payload,
        "documents": len(docs),
        "clients": args.clients,
        "requests_per_client": args.requests,
        **summarize(results, args.clients * args.requests, wall, args.request_timeout),
    }


async def run_soak(url: str, args) -> dict:
    """Open loop: one request every 1/rate s for `--soak` seconds; RSS sampled every `--sample-s`."""
    docs = payloads(args.documents, args.payload)
    results: list = []
    rss: list[tuple[float, float]] = []
    async with httpx.AsyncClient(timeout=args.request_timeout + 10) as client:
        t0, tasks, i = time.perf_counter(), [], 0
        next_sample = 0.0
        while (now := time.perf_counter() - t0) < args.soak:
            if now >= next_sample:
                value = await asyncio.to_thread(server_rss_mb, url)
                if value is not None:
                    rss.append((round(now, 1), round(value, 1)))
                next_sample += args.sample_s
            tasks.append(
                asyncio.create_task(
                    post(
                        client,
                        url,
                        results,
                        json=docs[i % len(docs)],
                        headers={"X-Request-Timeout": f"{args.request_timeout:g}"},
                    )
                )
            )
            i += 1
            await asyncio.sleep(max(0.0, i / args.rate - (time.perf_counter() - t0)))
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    after = [v for t, v in rss if t >= args.warmup_s]
    growth = round(100 * (after[-1] - after[0]) / after[0], 2) if len(after) >= 2 else None
    return {
        "url": url,
        "rate_per_s": args.rate,
        "seconds": args.soak,
        **summarize(results, i, wall, args.request_timeout),
        "rss_mb": {
            "warmup_end": after[0] if after else None,
            "end": after[-1] if after else None,
            "growth_pct_after_warmup": growth,
            "samples": rss,
        },
    }


async def run_probes(url: str, args) -> dict:
    """Issue 15's probes: a 6,000-word line and a 3-line request right behind it; a 12000x12000 PNG;
    30 uploads of the sample receipt, each with a 20 s client timeout."""
    out: dict = {}
    async with httpx.AsyncClient(timeout=60) as client:
        first, behind = [], []
        long_req = asyncio.create_task(post(client, url, first, json=one_line_payload(6000)))
        await asyncio.sleep(0.05)
        three_lines = [
            {"text": t, "box": [100 + 200 * j, 100 + 100 * r, 180 + 200 * j, 130 + 100 * r]}
            for r, line in enumerate(["ACME TRADING", "DATE 12/03/2019", "TOTAL 9.90"])
            for j, t in enumerate(line.split())
        ]
        await post(client, url, behind, json={"id": "three-lines", "words": three_lines})
        await long_req
        out["line_6000_words"] = {"status": first[0][0], "seconds": round(first[0][1], 2)}
        out["request_behind_it"] = {"status": behind[0][0], "seconds": round(behind[0][1], 2), "bound_s": 8}
        bomb, res = bomb_png(), []
        await post(client, url, res, files={"file": ("bomb.png", bomb, "image/png")})
        out["png_12000x12000"] = {
            "bytes": len(bomb),
            "status": res[0][0],
            "seconds": round(res[0][1], 2),
            "detail": res[0][2],
            "bound_s": 3,
        }
    uploads: list = []
    image = SAMPLE.read_bytes()
    async with httpx.AsyncClient(timeout=20, limits=httpx.Limits(max_connections=30)) as client:
        await asyncio.gather(
            *(post(client, url, uploads, files={"file": ("receipt.jpg", image, "image/jpeg")}) for _ in range(30))
        )
    counts = Counter(str(s) for s, _, _ in uploads)
    out["uploads_30_timeout_20s"] = {
        "statuses": dict(counts),
        "timed_out": sum(not isinstance(s, int) for s, _, _ in uploads),
        **{
            k: v
            for k, v in summarize(uploads, 30, 0, 20).items()
            if k in ("violations", "latency_ms", "rejection_latency_ms")
        },
    }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="an already running server (default: start one on a free port)")
    ap.add_argument(
        "--model", help="model directory for the server started here (default: models/pipkie, else a tiny random model)"
    )
    ap.add_argument("--tiny", action="store_true", help="use a tiny random model even if the shipped one exists")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--requests", type=int, default=10, help="requests per client, one after the other")
    ap.add_argument("--documents", type=int, default=20, help="distinct documents cycled through")
    ap.add_argument("--payload", choices=("words", "text"), default="words")
    ap.add_argument("--keys", default=None, help="comma-separated keys (default: the model's)")
    ap.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="start no request after this many seconds (default: every request is sent; a request "
        "in flight always gets its answer or its client timeout)",
    )
    ap.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        help="each request's deadline, the started server's --timeout (default 60; probes: the "
        "server's own default, 15, as a client that sends no X-Request-Timeout gets)",
    )
    ap.add_argument("--honour-retry-after", action="store_true", help="a refused client waits Retry-After first")
    ap.add_argument("--soak", type=float, default=0, help="soak for this many seconds instead of the load run")
    ap.add_argument("--rate", type=float, default=0.3, help="soak: requests per second")
    ap.add_argument("--warmup-s", type=float, default=300, help="soak: RSS growth is measured after this")
    ap.add_argument("--sample-s", type=float, default=10, help="soak: RSS sampling period")
    ap.add_argument("--probes", action="store_true", help="run issue 15's three probes instead of the load run")
    ap.add_argument("--threads", type=int, default=1, help="server torch/OCR threads")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--max-wait-ms", type=float, default=10)
    ap.add_argument("--json", dest="json_path", help="also write the summary here")
    args = ap.parse_args(argv)
    if args.request_timeout is None:
        args.request_timeout = 15.0 if args.probes else 60.0

    proc, tmp = None, None
    url = args.url.rstrip("/") if args.url else None
    try:
        if url is None:
            model = args.model
            shipped = ROOT / "models" / "pipkie"
            if model is None and not args.tiny and (shipped / "pipkie.json").exists():
                model = str(shipped)
            if model is None:
                tmp = tempfile.TemporaryDirectory(prefix="pipkie-load-")
                model = str(build_tiny_model(Path(tmp.name) / "tiny"))
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            proc = start_server(model, port, args)
        health = wait_healthy(url, proc, timeout=180)
        runner = run_probes if args.probes else run_soak if args.soak else run_load
        summary = asyncio.run(runner(url, args))
        batching = httpx.get(f"{url}/health", timeout=10).json().get("batching", {})
        calls = batching.get("model_calls") or 0
        summary["server"] = {
            "model": health.get("model"),
            "limits": health.get("limits"),
            "batching": batching,
            "documents_per_model_call": round(batching.get("documents", 0) / calls, 2) if calls else None,
        }
        print(json.dumps(summary, indent=2))
        if args.json_path:
            Path(args.json_path).write_text(json.dumps(summary, indent=2) + "\n")
        return 0 if args.probes or not any(summary["violations"].values()) else 1
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=45)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
