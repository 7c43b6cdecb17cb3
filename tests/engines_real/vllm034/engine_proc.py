"""One vLLM 0.34 engine's KV cache in a process of its own (``engines_pair.Engine``, elastic),
driven line by line on stdin so that a test can interleave two such processes on one card (the
host device under one ``WORKBENCH_KV_GPU_BUDGET``: each process charges its own slot of the
shared budget segment). Commands: ``take N`` (new blocks, held until ``free``), ``free``,
``state``, ``quit``; each answers one ``RESULT {json}`` line."""

from __future__ import annotations

import json
import sys

from engines_pair import CPU, Engine

from workbench import backends


def main() -> None:
    card = backends.shared_device(CPU)
    engine, held = Engine(sys.argv[1], card, "elastic"), []

    def answer(**out) -> None:
        out.update(engine.state(), card_free=card.mem_info().free)
        print("RESULT " + json.dumps(out), flush=True)

    answer(started=True)
    for line in sys.stdin:
        cmd, *arg = line.split()
        if cmd == "take":
            got = engine.take(int(arg[0]))
            held += got or []
            answer(took=got is not None)
        elif cmd == "free":
            engine.pool.free_blocks(held)
            held.clear()
            answer(freed=True)
        elif cmd == "state":
            answer()
        else:
            break


if __name__ == "__main__":
    main()
