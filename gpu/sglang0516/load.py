"""What ``serve.py`` sends and reads: SGLang's HTTP endpoints, prompts by token id, a load of
concurrent requests with the pools and the GPU sampled while it runs, and ``kvctl`` in a process
of its own (as an operator runs it)."""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

MiB = 1 << 20


def post(port: int, path: str, body: dict | None, timeout: float = 300.0):
    data = json.dumps(body).encode() if body is not None else b""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def flush(port: int) -> bool:
    """SGLang's ``/flush_cache``: the radix cache emptied (refused while requests run)."""
    try:
        post(port, "/flush_cache", None, timeout=60)
        return True
    except urllib.error.HTTPError:
        return False


def prompts(n_groups: int, per_group: int, prefix: int, tail: int, seed: int = 0):
    """``n_groups`` groups of ``per_group`` prompts sharing a ``prefix``-token head."""
    rng = random.Random(seed)
    out = []
    for _ in range(n_groups):
        shared = [rng.randrange(3, 4096) for _ in range(prefix)]
        out += [shared + [rng.randrange(3, 4096) for _ in range(tail)] for _ in range(per_group)]
    return out


def generate(port: int, ids: list[list[int]], params: dict) -> tuple[list[list[int]], float]:
    t0 = time.time()
    res = post(port, "/generate", {"input_ids": ids, "sampling_params": params})
    return [r["output_ids"] for r in res], time.time() - t0


def segment(name: str) -> dict | None:
    from workbench.core import control

    info = control.read_segment(name)
    if info is None:
        return None
    return {k: int(getattr(info, k)) for k in ("capacity", "mapped", "used_blocks", "limit")}


def kvctl(*args: str) -> str:
    p = subprocess.run([sys.executable, "-m", "workbench", "kvctl", *args], capture_output=True,
                       text=True, timeout=120)
    return (p.stdout + p.stderr)[-3000:]


def free_gpu() -> int:
    import torch

    return int(torch.cuda.mem_get_info(0)[0])


class Sampler:
    """Every 50 ms: each named pool's mapped bytes and the GPU's free bytes."""

    def __init__(self, names: list[str]):
        self.names, self.rows = names, []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.time()

    def _run(self) -> None:
        while not self._stop.is_set():
            segs = [segment(n) for n in self.names]
            self.rows.append((round(time.time() - self.t0, 3),
                              *[(s["mapped"] if s else 0) for s in segs], free_gpu()))
            time.sleep(0.05)

    def __enter__(self) -> Sampler:
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()

    def peaks(self) -> dict:
        if not self.rows:
            return {}
        cols = list(zip(*self.rows, strict=True))
        out = {f"{n}_mapped_max_mib": max(cols[1 + i]) // MiB for i, n in enumerate(self.names)}
        out.update({f"{n}_mapped_min_mib": min(cols[1 + i]) // MiB
                    for i, n in enumerate(self.names)})
        together = [sum(r[1:1 + len(self.names)]) for r in self.rows]
        out.update(together_max_mib=max(together) // MiB, free_gpu_min_mib=min(cols[-1]) // MiB,
                   free_gpu_max_mib=max(cols[-1]) // MiB, samples=len(self.rows))
        return out


def load_round(port: int, ids: list[list[int]], new_tokens: int, watch: list[str],
               at_s: float | None = None, then=None) -> dict:
    """All of ``ids`` at once (one thread each), greedy, ``new_tokens`` each; ``then()`` runs
    ``at_s`` seconds in (a ``kvctl limit`` from another process)."""
    failed: list[str] = []
    done: list[int] = []

    def one(i: int) -> None:
        try:
            post(port, "/generate", {"input_ids": ids[i], "sampling_params": {
                "max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}},
                 timeout=150)
            done.append(i)
        except Exception as err:  # noqa: BLE001 - counted, the round goes on
            failed.append(repr(err)[:200])

    with Sampler(watch) as s:
        t0 = time.time()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(ids))]
        for t in threads:
            t.start()
        mid = None
        if then is not None:
            time.sleep(at_s or 0.0)
            mid = {"at_s": round(time.time() - t0, 2), "said": then()}
        for t in threads:
            t.join()
        wall = time.time() - t0
    return {"requests": len(ids), "done": len(done), "failed": failed, "wall_s": round(wall, 3),
            "mid": mid, **s.peaks()}


def ratios(num: list[float], den: list[float]) -> dict:
    """Pairwise num/den (same repeat), median and range."""
    r = [a / b for a, b in zip(num, den, strict=True)]
    return {"per_pair": [round(x, 3) for x in r], "median": round(statistics.median(r), 3),
            "min": round(min(r), 3), "max": round(max(r), 3)}
