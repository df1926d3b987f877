#!/usr/bin/env python
"""Load test of `nmt serve` on loopback, checked against offline `nmt translate`.

    python -m bench.load_test --model model.nmt                      # 32 clients, 2,000 requests
    python -m bench.load_test --model model.nmt --clients 4 --requests 40 --threads 1   # the CI size

Builds `--requests` requests of 1-10 Multi30k sentences each (test_2016_flickr and val, German
side), translates all their sentences offline with `nmt translate` (fp32, whole process timed),
then starts `nmt serve` (fp32) on a free loopback port and sends the requests from `--clients`
concurrent clients (one keep-alive connection each). Every response must equal the offline
output for that request's own sentences, in order; a 503 is retried after its Retry-After.
Reports requests/s, sentences/s, p50/p99 latency and the server's sentences/s as a fraction of
offline `nmt translate` (goal >= 0.70), and exits 1 on any mismatch, lost or failed request.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.harness import REPO, describe, machine_facts, write_result


def multi30k_sentences(folder: Path) -> list[str]:
    sentences = []
    for split in ("test_2016_flickr", "val"):
        path = folder / f"{split}.de.gz"
        if not path.is_file():
            raise SystemExit(f"error: {path} not found; give --multi30k DIR or --source FILE")
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            sentences += [line.rstrip("\n") for line in handle]
    return [s for s in sentences if s.strip()]


def make_requests(pool: list[str], n: int, low: int, high: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [rng.sample(pool, rng.randint(low, high)) for _ in range(n)]


def offline(args: argparse.Namespace, requests: list[list[str]], env: dict) -> tuple[list[list[str]], float]:
    """Every request's sentences translated by `nmt translate` in one process; returns (outputs, seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "src.de", Path(tmp) / "hyp.en"
        src.write_text("".join(f"{s}\n" for request in requests for s in request), encoding="utf-8")
        cmd = [sys.executable, "-m", "nmt", "translate", "--model", str(args.model), "--precision", "fp32",
               "--device", args.device, "--threads", str(args.threads), "-q", "-i", str(src), "-o", str(out)]
        start = time.perf_counter()
        subprocess.run(cmd, check=True, env=env)
        seconds = time.perf_counter() - start
        lines = out.read_text(encoding="utf-8").split("\n")[:-1]
    outputs, i = [], 0
    for request in requests:
        outputs.append(lines[i:i + len(request)])
        i += len(request)
    assert i == len(lines), "offline output has the wrong number of lines"
    return outputs, seconds


def start_server(args: argparse.Namespace, env: dict) -> tuple[subprocess.Popen, int, list[str], threading.Thread]:
    cmd = [sys.executable, "-m", "nmt", "serve", "--model", str(args.model), "--port", "0", "--host", "127.0.0.1",
           "--precision", "fp32", "--device", args.device, "--threads", str(args.threads), *args.serve_option]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    log: list[str] = []
    deadline = time.monotonic() + 300
    port = None
    while port is None:
        line = proc.stderr.readline()
        if not line or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("error: nmt serve did not start:\n" + "".join(log)[-2000:])
        log.append(line)
        match = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        port = int(match.group(1)) if match else None
    reader = threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True)
    reader.start()
    return proc, port, log, reader


def post(conn: http.client.HTTPConnection, sentences: list[str]) -> tuple[int, dict, dict]:
    body = json.dumps(sentences).encode("utf-8")
    conn.request("POST", "/translate", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    payload = json.loads(response.read() or b"{}")
    return response.status, dict(response.getheaders()), payload


def run_clients(port: int, requests: list[list[str]], expected: list[list[str]], clients: int) -> dict:
    next_index = iter(range(len(requests)))
    lock = threading.Lock()
    latencies: list[float] = []
    problems: list[str] = []
    retries = [0]

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        while True:
            with lock:
                index = next(next_index, None)
            if index is None:
                break
            start = time.perf_counter()
            while True:
                try:
                    status, headers, payload = post(conn, requests[index])
                except (OSError, http.client.HTTPException, ValueError) as exc:
                    status, payload = -1, {"error": repr(exc)}
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
                if status != 503:
                    break
                with lock:
                    retries[0] += 1
                time.sleep(float(headers.get("retry-after", "1")))
            elapsed = time.perf_counter() - start
            with lock:
                latencies.append(elapsed)
                if status != 200:
                    problems.append(f"request {index}: HTTP {status} {payload.get('error', '')}")
                elif payload.get("translations") != expected[index]:
                    problems.append(f"request {index}: response differs from offline nmt translate")
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start
    latencies.sort()
    return {"seconds": seconds, "latencies": latencies, "problems": problems, "retries_503": retries[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="model file or checkpoint")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--min-sentences", type=int, default=1)
    parser.add_argument("--max-sentences", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads for both sides")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--multi30k", type=Path,
                        default=Path(os.environ.get("NMT_MULTI30K", REPO.parent / "shared" / "data" / "multi30k")))
    parser.add_argument("--source", type=Path, help="one sentence per line, instead of Multi30k")
    parser.add_argument("--serve-option", action="append", default=[], help="extra option for nmt serve")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()

    pool = (args.source.read_text(encoding="utf-8").splitlines() if args.source
            else multi30k_sentences(args.multi30k))
    requests = make_requests(pool, args.requests, args.min_sentences, args.max_sentences, args.seed)
    n_sentences = sum(len(r) for r in requests)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    print(f"{len(requests)} requests, {n_sentences} sentences, {args.clients} clients, {args.threads} thread(s)",
          file=sys.stderr)
    expected, offline_seconds = offline(args, requests, env)
    proc, port, log, reader = start_server(args, env)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        post(conn, requests[0])                                   # warm-up, not counted
        conn.close()
        result = run_clients(port, requests, expected, args.clients)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
        reader.join(timeout=30)                     # its last lines may still be in the pipe
    lat = result["latencies"]
    report = {
        "requests": len(requests), "sentences": n_sentences, "clients": args.clients, "threads": args.threads,
        "requests_per_s": len(requests) / result["seconds"],
        "sentences_per_s": n_sentences / result["seconds"],
        "latency_p50_ms": 1000 * statistics.median(lat) if lat else None,
        "latency_p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None,
        "offline_sentences_per_s": n_sentences / offline_seconds,
        "fraction_of_offline": (n_sentences / result["seconds"]) / (n_sentences / offline_seconds),
        "answered": len(lat), "mismatches_or_failures": len(result["problems"]), "retries_503": result["retries_503"],
        "server_exit_code": code, "request_log_lines": sum("POST /translate" in line for line in log),
        "machine": machine_facts(args.threads, "float32"),
    }
    for problem in result["problems"][:10]:
        print(problem, file=sys.stderr)
    print(f"load test: {report['requests']} requests ({report['sentences']} sentences) from {args.clients} clients, "
          f"{describe(report['machine'])}\n"
          f"  server   {report['requests_per_s']:.1f} requests/s  {report['sentences_per_s']:.1f} sentences/s  "
          f"latency p50 {report['latency_p50_ms']:.0f} ms  p99 {report['latency_p99_ms']:.0f} ms\n"
          f"  offline  {report['offline_sentences_per_s']:.1f} sentences/s (nmt translate, whole process)\n"
          f"  server / offline = {report['fraction_of_offline']:.2f} (goal >= 0.70)\n"
          f"  answered {report['answered']}/{report['requests']}, mismatches or failures "
          f"{report['mismatches_or_failures']}, 503 retries {report['retries_503']}, "
          f"server exit code {code} after SIGTERM")
    if args.json_out:
        write_result(args.json_out, report)
    ok = report["answered"] == report["requests"] and not result["problems"]
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
