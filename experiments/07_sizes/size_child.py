"""One measurement of the size experiment, in a process of its own (so its peak memory and its first read are its
own): `python child.py SPEC.json OUT.json`. SPEC's "phase" says which:

- "load": the checkpoint read, then pushed into the store (emptied of it first): seconds, bytes, peak memory.
- "generate": a fresh process on a loaded store, as `vecgpt generate --model PATH` runs: opening the store, finding
  the model (reading the checkpoint for its fingerprint), opening a text, the prompt's first read (cold: the
  store's files and the checkpoint out of the page cache where the parent evicted them), then n greedy tokens.
- "numpy": vecgpt.reference.Reference in float32 on the checkpoint, the same prompt and tokens.
- "transformers": GPT2LMHeadModel from the same folder with its KV cache; {"missing": why} without torch.

Peak memory is the process's VmHWM (the kernel's high-water mark of resident memory): after finding the model it is
reset (/proc/self/clear_refs), so a generate's `peak_mb` is the store's and the engine's alone.
"""

from __future__ import annotations

import cProfile
import gc
import json
import os
import pstats
import resource
import sys
import time
from pathlib import Path


def status_mb(field: str, pid: int | str = "self") -> float | None:
    """A /proc/<pid>/status figure (VmHWM, VmRSS) in MB; None where it cannot be read (not Linux, process gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / 1e6
    except (OSError, ValueError):
        return None
    return None


def reset_peak() -> bool:
    """Start the high-water mark again from the current resident memory (Linux 4.0+); False where it cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6  # KB on Linux


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def config_of(spec: dict):
    from vecgpt.config import load_config

    config = load_config(spec["config"], layout=spec["layout"])
    config.store = dict(spec["store"])
    return config


def load_phase(spec: dict) -> dict:
    from vecgpt import weights
    from vecgpt.config import open_store
    from vecgpt.loading import drop, plan, push, store_fingerprint

    config = config_of(spec)
    model, read_s = timed(lambda: weights.load(spec["model"]))
    peak_read = status_mb("VmHWM")
    store, open_s = timed(lambda: open_store(config))
    try:
        key = store_fingerprint(model, config.metric, config.layout)
        drop(store, key)
        before = usage(store)
        manifest, push_s = timed(lambda: push(store, model, config.metric, not spec["quiet"], config.layout))
        spent = spent_since(store, before)
        rows = plan(model, config.metric, config.layout)
        stats = store.stats()
        server = server_memory(config.store)
    finally:
        store.close()
    held = [s for name, s in stats.items() if name.startswith(key) and isinstance(s, dict)]
    out = {
        "checkpoint_read_s": read_s,
        "open_s": open_s,
        "load_s": push_s,
        "documents": manifest["documents"],
        "float32_bytes": sum(n * d * 4 for _, n, d in rows),
        "stored_documents": sum(s.get("documents", 0) for s in held),
        "stored_bytes": sum(s.get("bytes", 0) for s in held),
        "peak_mb_after_read": peak_read,
        "peak_mb": status_mb("VmHWM"),
        "maxrss_mb": maxrss_mb(),
        **server,
    }
    if spent is not None:
        from vecgpt.backends.turbopuffer import dollars

        out.update(load_usage=spent, load_dollars=dollars(spent))
    return out


def server_memory(options: dict) -> dict:
    """A local PostgreSQL's memory (pgvector with a data_dir): the largest peak (VmHWM) of its processes, in MB, and
    their number; {} for other stores. Its processes share its buffers, so this is the least it held."""
    folder = options.get("data_dir")
    pid_file = Path(folder).expanduser() / "postmaster.pid" if folder else None
    if pid_file is None or not pid_file.is_file():
        return {}
    main = pid_file.read_text().split()[0]
    pids = [main] + [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and parent(p.name) == main]
    peaks = [m for m in (status_mb("VmHWM", p) for p in pids) if m is not None]
    return {"server_peak_mb": max(peaks), "server_processes": len(peaks)} if peaks else {}


def parent(pid: str) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):
        return None


def usage(store) -> dict | None:
    tally = getattr(store, "usage", None)
    return None if tally is None else dict(tally)


def spent_since(store, before: dict | None) -> dict | None:
    now = usage(store)
    return None if now is None else {k: v - (before or {}).get(k, 0) for k, v in now.items()}


def find_model(path: str) -> tuple[str, dict]:
    """What `vecgpt generate --model PATH` does to name the model: the checkpoint's fingerprint (weights.load of the
    whole checkpoint, then its hash), each timed."""
    from vecgpt import weights

    model, read_s = timed(lambda: weights.load(path))
    found, hash_s = timed(lambda: model.fingerprint)
    return found, {"checkpoint_read_s": read_s, "fingerprint_s": hash_s, "find_model_s": read_s + hash_s}


def whole_read(path: str, fingerprint: str) -> dict:
    """Finding the model the way that reads it all: every tensor of the checkpoint read into memory as float32, then
    hashed as weights.fingerprint hashes them (sorted names, float32 bytes); the same fingerprint is checked."""
    import hashlib

    import numpy as np
    from safetensors.numpy import load_file

    flat, read_s = timed(lambda: load_file(str(Path(path) / "model.safetensors")))

    def digest() -> str:
        found = hashlib.sha256()
        for name in sorted(flat):
            found.update(name.removeprefix("transformer.").encode())
            found.update(np.ascontiguousarray(flat[name], dtype=np.float32).tobytes())
        return found.hexdigest()[:16]

    hashed, hash_s = timed(digest)
    return {"whole_read_s": read_s, "whole_hash_s": hash_s, "whole_same_fingerprint": hashed == fingerprint}


def generate_phase(spec: dict) -> dict:
    from vecgpt import encoding
    from vecgpt.config import open_store
    from vecgpt.engine import Engine

    config = config_of(spec)
    began = time.perf_counter()
    store, open_s = timed(lambda: open_store(config))
    try:
        found, parts = find_model(spec["model"])
        if spec.get("whole_read"):
            parts.update(whole_read(spec["model"], found))
        peak_find = status_mb("VmHWM")
        gc.collect()
        reset = reset_peak()
        suffix = "" if config.layout == "four" else f"-{config.layout}"
        key = f"{found}-e{encoding.ENCODING_VERSION}-{config.metric}{suffix}"  # loading.store_fingerprint's
        c = config
        engine, engine_s = timed(
            lambda: Engine(store, c.top_k, c.prompt_block, model=key, prefill_chunk=c.prefill_chunk)
        )
        text, text_s = timed(engine.open)
        out = {"open_s": open_s, **parts, "engine_s": engine_s, "open_text_s": text_s, **read_tokens(text, store, spec)}
        aside = sum(out["token_s"]) + out.get("whole_read_s", 0) + out.get("whole_hash_s", 0)
        out["first_token_s"] = time.perf_counter() - began - aside  # to the prompt's candidates
        text.close()
        out.update(server_memory(config.store))
        out["peak_mb"] = status_mb("VmHWM") if reset else None  # before numpy's copy of the model below
        out["peak_before_numpy"] = True
        if spec.get("numpy_beside"):
            out["numpy_beside"] = numpy_beside(spec)
        if spec.get("drop"):
            from vecgpt.loading import drop

            drop(store, key)
    finally:
        store.close()
    return {**out, "peak_mb_find_model": peak_find}


def read_tokens(text, store, spec: dict) -> dict:
    """The prompt's first read, then n greedy tokens, each timed; the meter's figures and dollars a token."""
    cands, first_s = timed(lambda: text.read(spec["prompt"]))
    tokens, times, before = [int(cands.ids[0])], [], usage(store)
    profile = cProfile.Profile() if spec.get("profile") else None
    for _ in range(spec["n"]):
        text.meter.start_token()
        profile and profile.enable()
        cands, s = timed(lambda: text.read([tokens[-1]]))
        profile and profile.disable()
        tokens.append(int(cands.ids[0]))
        times.append(s)
    out = {"first_read_s": first_s, "token_s": times, "tokens": tokens, **meter_figures(text.meter.summary())}
    if profile is not None:
        out["profile"] = top_functions(profile, spec["n"])
    spent = spent_since(store, before)
    if spent is not None:
        from vecgpt.backends.turbopuffer import dollars

        out["usage_per_token"] = {k: v / len(times) for k, v in spent.items()}
        out["dollars_per_token"] = dollars(spent) / len(times)
    return out


def top_functions(profile, tokens: int, count: int = 15) -> list[dict]:
    """cProfile's functions by their own time, seconds a token (the main thread's: worker threads are not seen)."""
    stats = pstats.Stats(profile)
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:count]
    return [
        {"function": f"{Path(f).name}:{line}({name})", "own_s": t / tokens, "cumulative_s": c / tokens, "calls": n}
        for (f, line, name), (_, n, t, c, _) in rows
    ]


def meter_figures(summary: dict) -> dict:
    """Requests, round trips and subqueries: the prompt's read and the mean over the generated tokens."""
    first, decode = summary["per_token"][0], summary["per_token"][1:]

    def mean(field):
        return sum(t[field] for t in decode) / len(decode) if decode else None

    return {
        "prompt_requests": first["total"],
        "prompt_round_trips": first["round_trips"],
        "requests_per_token": mean("total"),
        "round_trips_per_token": mean("round_trips"),
        "subqueries_per_token": mean("subqueries"),
        "store_s_per_token": mean("seconds"),
        "store_s_by_kind_per_token": {
            k: sum(t["seconds_by_kind"].get(k, 0) for t in decode) / len(decode)
            for k in sorted({k for t in decode for k in t["seconds_by_kind"]})
        }
        if decode
        else {},
    }


def numpy_beside(spec: dict) -> dict:
    """numpy float32 on the same prompt and tokens in this process, just after the store's: a ratio under the same
    load (the machine is shared)."""
    import numpy as np

    from vecgpt import weights
    from vecgpt.reference import Reference

    return plain_tokens(Reference(weights.load(spec["model"]), np.float32), spec)


def numpy_phase(spec: dict) -> dict:
    import numpy as np

    from vecgpt import weights
    from vecgpt.reference import Reference

    reader, read_s = timed(lambda: Reference(weights.load(spec["model"]), np.float32))  # weights.load may be lazy
    return {"checkpoint_read_s": read_s, **plain_tokens(reader, spec), "peak_mb": status_mb("VmHWM")}


def plain_tokens(reader, spec: dict) -> dict:
    cands, first_s = timed(lambda: reader.read(spec["prompt"]))
    tokens, times = [int(cands.ids[0])], []
    for _ in range(spec["n"]):
        cands, s = timed(lambda: reader.read([tokens[-1]]))
        tokens.append(int(cands.ids[0]))
        times.append(s)
    return {"first_read_s": first_s, "token_s": times, "tokens": tokens}


def transformers_phase(spec: dict) -> dict:
    try:
        import torch
        from transformers import GPT2LMHeadModel
    except ImportError as e:
        return {"missing": f"{e} (pip install 'vecgpt[transformers]')"}
    import numpy as np

    from vecgpt.sampling import Candidates

    torch.set_num_threads(spec["threads"])
    hf, read_s = timed(lambda: GPT2LMHeadModel.from_pretrained(spec["model"]).eval())

    class Reader:
        past = None

        def read(self, ids, k: int = 40):
            with torch.inference_mode():
                out = hf(torch.tensor([list(ids)]), past_key_values=self.past, use_cache=True)
            self.past = out.past_key_values
            logits = out.logits[0, -1].double().numpy()
            top = np.argsort(-logits)[:k]
            return Candidates(top, logits[top])

    return {"checkpoint_read_s": read_s, **plain_tokens(Reader(), spec), "peak_mb": status_mb("VmHWM")}


PHASES = {"load": load_phase, "generate": generate_phase, "numpy": numpy_phase, "transformers": transformers_phase}


def main(spec_path: str, out_path: str) -> int:
    from vecgpt.errors import VecgptError

    spec = json.loads(Path(spec_path).read_text())
    try:
        result = PHASES[spec["phase"]](spec)
    except VecgptError as e:
        result = {"error": str(e)}
    result.setdefault("maxrss_mb", maxrss_mb())
    result["load_average"] = os.getloadavg()  # the machine is shared: how busy it was as this ended
    Path(out_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TURBOPUFFER_API_KEY", "local")
    sys.exit(main(*sys.argv[1:3]))
