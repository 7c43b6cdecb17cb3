"""What every lab's server runner needs, for any server engine kind: the kind's interpreter and
tiny model, engines started side by side, prompts by token id, and the engine's own counters. A
runner is given the kind's name (the resolved run's ``kind``); what differs between kinds lives
in the kind's :class:`~workbench.engines.real.server.ServerEngine` (:mod:`workbench.engines.kinds`),
so a runner's code is the same for all of them."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

from workbench.engines import kinds
from workbench.engines.real.client import Sampling
from workbench.engines.real.server import LOGS, STAND_INS, ServerEngine, device_free_bytes
from workbench.engines.sched.request import Request

__all__ = ["LOGS", "STAND_INS", "VOCAB_HI", "VOCAB_LO", "blocks_per_page", "counters", "lab_pool",
           "device_free", "device_of", "engine", "model_dir", "prompts", "python_for", "send",
           "start_all", "workroot"]

VOCAB_LO, VOCAB_HI = 3, 1000  # the tiny model's ids past its special tokens


def device_of(backend: str) -> str:
    """The torch device an engine on ``backend`` computes on (``cpu``, ``cuda``)."""
    from workbench.backends import capabilities

    return capabilities(backend).torch_device or "cpu"


def server(kind: str) -> type[ServerEngine]:
    """The class that starts and reads engines of server kind ``kind``."""
    return kinds.get(kind).server()


def python_for(lab: str, kind: str = "vllm") -> str:
    """The interpreter that runs ``kind``'s server (a stand-in's own: this one)."""
    return server(kind).require(f"lab {lab!r} with engine={kind}")


def model_dir(python: str, root: Path, kind: str = "vllm") -> str:
    """The tiny random Llama ``kind`` serves in the labs (built once per run)."""
    return server(kind).model_dir(python, root)


def prompts(n: int, shared: int, tail: int, seed: int) -> list[list[int]]:
    """``n`` prompts of exactly ``shared + tail + 2*i`` tokens: a shared head (prefix hits),
    then each its own tail."""
    import random

    rng = random.Random(seed)
    head = [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(shared)]
    return [head + [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(tail + 2 * i)]
            for i in range(n)]


def start_all(engines: list[ServerEngine]) -> list[ServerEngine]:
    """Start every engine at once (imports and start-up overlap); close all if one fails. The
    processes are launched from this thread (they die with the thread that started them)."""
    errors: list[BaseException] = []
    try:
        for e in engines:
            e.launch()
    except BaseException:
        for e in engines:
            e.close()
        raise

    def go(e: ServerEngine) -> None:
        try:
            e.ready()
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=go, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        for e in engines:
            e.close()
        raise errors[0]
    return engines


def send(eng: ServerEngine, batch: list[list[int]], n: int, sampling: Sampling,
         first_rid: int = 0) -> list[list[int]]:
    """One wave, all at once; the output token ids per prompt ([] for a lost request)."""
    eng.sampling = sampling
    eng._sender.sampling = sampling
    reqs = [Request(rid=first_rid + i, prompt=p, max_new_tokens=n) for i, p in enumerate(batch)]
    eng.submit(reqs)
    eng.advance()
    return [eng.outcome(r.rid).token_ids for r in reqs]


def counters(eng: ServerEngine) -> dict[str, float]:
    """The engine's own counters (preemptions, prefix-cache queries and hits, running,
    waiting); {} for a kind that publishes none."""
    return eng.counters()


def engine(name: str, backend: str, model: str, python: str, root: Path, *, elastic: bool,
           kind: str = "vllm", **kw) -> ServerEngine:
    """One engine of server kind ``kind``. ``kw`` are the kind's spec fields; those the runners
    share are given vLLM's names (renamed by the kind)."""
    return server(kind).for_lab(name, device_of(backend), model, python, root,
                                elastic=elastic, **kw)


def lab_pool(kind: str) -> dict:
    """The spec fields of the small pool the labs give a kind that would size its own."""
    return dict(server(kind).lab_pool)


def workroot() -> Path:
    """A scratch folder for one run, removed with its engines also on SIGTERM/SIGINT/exit."""
    from workbench.engines.real.procs import Reaper, install_handlers

    root = Path(tempfile.mkdtemp(prefix="wb-vllm-lab-"))
    install_handlers()
    Reaper(folders=[root])  # registered; closed by the handlers (run() also removes it)
    return root


def device_free(device: str) -> int:
    return device_free_bytes(device)


def blocks_per_page(eng: ServerEngine, page_id_bytes: int) -> tuple[int, int]:
    """(one ledger block in tokens, ledger blocks per page id) for a started engine."""
    return eng.blocks_per_page(page_id_bytes)
