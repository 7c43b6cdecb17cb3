"""Starts one ``vllm`` kind over the fake server, sends long requests and prints what it
started (``STARTED {json}``), then waits: the test interrupts it mid-run."""

from __future__ import annotations

import json
import os
import sys
import time

from workbench.engines.real import VllmEngine, VllmSpec
from workbench.engines.real.procs import descendants
from workbench.engines.sched.request import Request

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    real = os.environ.get("DRIVER_MODEL")  # a model folder: a real vLLM, else the stand-in
    spec = VllmSpec(model=real, python=sys.executable, max_num_seqs=4) if real else VllmSpec(
        model="fake", server_cmd=[sys.executable, os.path.join(HERE, "fake_server.py")],
        startup_timeout_s=60)
    eng = VllmEngine("drv", spec).start()
    n = 400 if real else 100000
    eng.submit(Request(rid=i, prompt=[5, 6, 7], max_new_tokens=n) for i in range(3))
    while not any(r.token_times for r in eng.requests) or eng.kv_pool.info() is None:
        time.sleep(0.05)
    print("STARTED " + json.dumps({"server": eng.process.pid, "dir": str(eng.dir),
                                   "ipc": eng.ipc_name, "all": descendants(os.getpid())}),
          flush=True)
    eng.advance()


if __name__ == "__main__":
    main()
