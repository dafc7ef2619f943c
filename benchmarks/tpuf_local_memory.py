"""The local turbopuffer server's memory against the float32 bytes it holds, for one big load.

    python benchmarks/tpuf_local_memory.py --model PATH [--layout five] [--replicas 1] [--server-arg=--float32]

Starts `vecgpt tpuf-local` in a process of its own, loads the model into it with `vecgpt load` (another
process, so the server's figures are its own), samples the server's resident memory every 0.2 s and reads its
peak (VmHWM) at the end. The float32 bytes are the vectors it holds: every namespace's rows times its
dimension times 4. Prints and writes benchmarks/results/tpuf_local_memory.json. A GPT-2 medium-shaped model:
`vecgpt make-model --layers 24 --heads 16 --embd 1024 PATH`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from provenance import machine

KEY = "memory-benchmark-key"


def status_kb(pid: int, field: str) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M).group(1))


def start_server(extra: list[str]) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "vecgpt.backends.turbopuffer.server", "--port", "0", "--api-key", KEY, *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    found = re.search(r"http://127\.0\.0\.1:\d+", proc.stdout.readline())
    if not found:
        proc.kill()
        raise SystemExit("the local server did not start")
    return proc, found.group()


def get(url: str, path: str) -> dict:
    req = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def held(url: str, prefix: str) -> tuple[int, int]:
    """(documents, float32 vector bytes) in the namespaces under `prefix`."""
    docs = vec_bytes = 0
    for ns in get(url, f"/v1/namespaces?prefix={prefix}&page_size=1000")["namespaces"]:
        meta = get(url, f"/v2/namespaces/{ns['id']}/metadata")
        vtype = meta["schema"].get("vector", {}).get("type", "[0]f32")
        docs += meta["approx_row_count"]
        vec_bytes += meta["approx_row_count"] * int(vtype[1:].split("]")[0]) * 4
    return docs, vec_bytes


def load(url: str, args) -> float:
    folder = Path(tempfile.mkdtemp())
    config = folder / "tpuf.toml"
    config.write_text(
        'backend = "turbopuffer"\nmetric = "l2"\n[store]\n'
        f'base_url = "{url}"\nprefix = "mem-"\nreplicas = {args.replicas}\nkey_replicas = 1\n'
        "max_retries = 3\ntimeout = 120.0\n"
    )
    env = {**os.environ, "TURBOPUFFER_API_KEY": KEY}
    env.pop("TURBOPUFFER_REGION", None)
    cmd = [sys.executable, "-m", "vecgpt", "load", "--config", str(config), "--model", args.model]
    start = time.perf_counter()
    done = subprocess.run([*cmd, "--layout", args.layout], env=env, capture_output=True, text=True)
    if done.returncode:
        print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
    return time.perf_counter() - start, done.returncode


def sample(pid: int, peak: list, stop: threading.Event) -> None:
    while not stop.wait(0.2):
        try:
            peak[0] = max(peak[0], status_kb(pid, "VmRSS"))
        except (OSError, AttributeError):
            return


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--layout", default="five")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--server-arg", action="append", default=[], help="an option passed to the server")
    p.add_argument("--out", default="benchmarks/results/tpuf_local_memory.json")
    args = p.parse_args(argv)
    proc, url = start_server(args.server_arg)
    try:
        base = status_kb(proc.pid, "VmRSS")
        peak, stop = [base], threading.Event()
        watcher = threading.Thread(target=sample, args=(proc.pid, peak, stop), daemon=True)
        watcher.start()
        seconds, rc = load(url, args)
        stop.set()
        hwm, rss = status_kb(proc.pid, "VmHWM"), status_kb(proc.pid, "VmRSS")
        docs, vec_bytes = held(url, "mem-")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    out = report(args, seconds, rc, base, hwm, rss, docs, vec_bytes)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


def report(args, seconds, rc, base, hwm, rss, docs, vec_bytes) -> dict:
    gb = 1e9 / 1024
    out = {
        "model": args.model,
        "layout": args.layout,
        "replicas": args.replicas,
        "server_args": args.server_arg,
        "load_exit_code": rc,
        "load_s": round(seconds, 1),
        "documents": docs,
        "float32_bytes": vec_bytes,
        "rss_before_gb": round(base / gb, 3),
        "peak_rss_gb": round(hwm / gb, 3),
        "rss_after_gb": round(rss / gb, 3),
        "peak_per_float32_byte": round((hwm - base) * 1024 / max(vec_bytes, 1), 3),
        "held_per_float32_byte": round((rss - base) * 1024 / max(vec_bytes, 1), 3),
        "machine": machine(1),
    }
    for k, v in out.items():
        if k != "machine":
            print(f"{k:>22}: {v}")
    return out


if __name__ == "__main__":
    main()
