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
    spec = VllmSpec(model="fake", server_cmd=[sys.executable, os.path.join(HERE, "fake_server.py")],
                    startup_timeout_s=60)
    eng = VllmEngine("drv", spec).start()
    eng.submit(Request(rid=i, prompt=[1, 2, 3], max_new_tokens=100000) for i in range(3))
    while not any(r.token_times for r in eng.requests) or eng.kv_pool.info() is None:
        time.sleep(0.05)
    print("STARTED " + json.dumps({"server": eng.process.pid, "dir": str(eng.dir),
                                   "ipc": eng.ipc_name, "all": descendants(os.getpid())}),
          flush=True)
    eng.advance()


if __name__ == "__main__":
    main()
