"""What a real colocation record says of its engine beyond step times, for the simulator:

* ``client_s``: the streaming client's own share of a TTFT (HTTP, the API server, the output
  stream): each engine's first request of a point, its TTFT less the step that prefilled it
  (schedule to output), median over points; the simulator adds it to every TTFT;
* ``kv_blocks_first``: the KV tensor keeps K and V inside each block (one buffer per layer), read
  from the elastic pools' mapped sizes: they move in page ids of one buffer per layer (half
  those of separate K and V buffers);
* ``async_scheduling``: most steps were planned before the one ahead had been processed
  (:func:`workbench.bench.steprows.is_async`); the simulated engine then admits an arrival one
  step later.

The client's share is measured either way, but added only to an engine simulated without async
scheduling: the simulator admits a request at step boundaries, so a later admission already
charges about one step of latency, which the real engine spends partly in the client's share
(on the 2026-12-01 fit sweep, adding it as well raised the error, mean |log sim/real| of TTFT
p50 and p99 0.149 -> 0.162).
"""

from __future__ import annotations

import math
import statistics

from workbench.bench import steprows
from workbench.engines.models import get_model


def client_s(reps: list[dict]) -> tuple[float, int] | None:
    """The median client share (seconds) over every engine's first request of every point,
    and how many were read; None without steps."""
    got = []
    for rep in reps:
        for run in rep["runs"].values():
            for i, e in enumerate(run.get("steps") or []):
                first = [q for q in run.get("requests", []) if q[0] == i and q[2] is not None]
                if not e or not e.get("rows") or not first:
                    continue
                q, row = min(first, key=lambda q: q[1]), e["rows"][0]
                f = e["fields"]
                if row[f.index("prefill_tokens")] > 0:
                    got.append(q[2] - row[f.index("dur_s")])
    return (statistics.median(got), len(got)) if got else None


def mapped_step_mib(reps: list[dict]) -> int | None:
    """The largest step every elastic pool's mapped size moved in (MiB), None if none mapped."""
    g = 0
    for rep in reps:
        for run in rep["runs"].values():
            for row in run.get("mapped_timeline") or []:
                for v in row[1:]:
                    g = math.gcd(g, int(v))
    return g or None


def facts(reps: list[dict], model: str, page_size: int = 2 << 20) -> dict:
    """The engine facts of ``reps`` (see the module doc) and what each was read from."""
    m = get_model(model)
    split_mib = page_size * m.num_layers * 2 // 2**20
    step = mapped_step_mib(reps)
    cs = client_s(reps)
    engines = [e for rep in reps for key in rep["runs"]
               for e in (steprows.record_steps(rep, key) or []) if e]
    seen_async = bool(engines) and sum(map(steprows.is_async, engines)) > len(engines) / 2
    client = round(cs[0], 4) if cs else 0.0
    return {"engine": {"kv_blocks_first": step is not None and step * 2 == split_mib,
                       "async_scheduling": seen_async,
                       "client_s": 0.0 if seen_async else client},
            "read_from": {"mapped_step_mib": step, "split_page_id_mib": split_mib,
                          "client_s_measured": client, "client_requests": cs[1] if cs else 0,
                          "async_scheduling_seen": seen_async}}
