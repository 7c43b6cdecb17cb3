"""``python -m workbench.labs.vllm_runs LAB [--backend host|gpu] [--quick] [--out DIR]``: one
lab on a real vLLM; writes ``DIR/LAB.json`` (the record) and ``DIR/LAB.md``."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from pathlib import Path

from workbench.errors import ConfigError
from workbench.labs.vllm_runs import report
from workbench.labs.vllm_runs.lab import MODULES


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.labs.vllm_runs")
    ap.add_argument("labs", nargs="+", choices=sorted(MODULES))
    ap.add_argument("--backend", default="host", choices=("host", "gpu"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="results/vllm")
    a = ap.parse_args(argv)
    out_dir, rc = Path(a.out), 0
    from workbench.labs.vllm_runs import rig

    rig.LOGS[:] = [out_dir / "logs"]
    for lab in a.labs:
        mod = importlib.import_module(f"workbench.labs.vllm_runs.{MODULES[lab]}")
        t0 = time.monotonic()
        try:
            raw = mod.run(a.backend, quick=a.quick)
        except ConfigError as err:
            print(err, file=sys.stderr)
            return 2
        except Exception as err:  # one lab's failure is reported; the next still runs
            print(f"{lab}: FAILED: {type(err).__name__}: {str(err)[-3000:]}\n"
                  f"{traceback.format_exc()[-1500:]}", flush=True)
            rc = 1
            continue
        rec, md = report.REPORTS[lab](raw)
        rec.raw_data["wall_s"] = round(time.monotonic() - t0, 1)
        rec.write(out_dir / f"{lab}.json", md)
        print(f"{lab}: {rec.verdict} | {rec.outcomes['headline']} | "
              f"{rec.raw_data['wall_s']} s", flush=True)
        print(json.dumps({"lab": lab, "verdict": rec.verdict}), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
