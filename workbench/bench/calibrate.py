"""Calibrate the simulator's step-time model from the mini engine's measured steps, then run the
colocation workload on ``sim`` and put its TTFT beside the GPU's (:mod:`workbench.bench.simgpu`).

The model (``workbench.engines.sim.steptime.StepTimeModel``) charges a step
``max(flops / (peak_flops * flops_eff), bytes / (peak_bw * bw_eff)) + step_overhead_s +
seq_overhead_s * num_seqs`` plus ``prefill_overhead_s`` when it computes a prefill chunk (an engine
with decode CUDA graphs has two step paths: a graph replay for decode-only steps, the eager forward
for the rest). :func:`workbench.bench.stepfit.fit_steptime` grid-searches the two efficiencies and
solves the overheads by least squares at each grid point, minimising the *relative* error (steps
span milliseconds to seconds). The prefill term is fitted only on a sweep whose decode ran in
graphs. Runs on a CPU: ``python -m workbench.bench.calibrate --sweep DIR [--sweep DIR2] [--bench
B]`` (DIR: the colocation lab's gpu ``out_dir``; the fit uses the sweep's own steps).

A real engine's steps (``workbench.adapters.vllm.steplog`` logs, or a real colocation record that
kept them) are fitted the same way and kept as a named profile in ``hardware.py``:
``python -m workbench.bench.calibrate STEPLOG_OR_RECORD... --name NAME [--repeats 0]
[--peaks 2,6]`` prints the fit and its residuals and writes the profile with its provenance
(see :mod:`workbench.bench.steprows` for what is taken of each step).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from workbench.bench import calibrate_real
from workbench.bench.stepfit import fit_steptime
from workbench.outfiles import check, run_main, write_text
from workbench.strictjson import dumps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="fit the H200 step-time preset; sim vs GPU TTFT")
    ap.add_argument("inputs", nargs="*", type=Path, metavar="STEPLOG_OR_RECORD",
                    help="real engine steps: step logs (JSON lines; several = engines of one "
                         "run) or real colocation records (file, gzip'd file or out_dir)")
    ap.add_argument("--name", help="write the fit into hardware.py as this step profile")
    ap.add_argument("--repeats", help="record repeats to fit on, e.g. 0 (default: all)")
    ap.add_argument("--peaks", help="record PEAKs to fit on, e.g. 2,6 (default: all)")
    ap.add_argument("--all-steps", action="store_true",
                    help="also steps that overlapped another engine's (default: solo steps)")
    ap.add_argument("--gpu", default="h200", help="the GPU preset the fit scales (default h200)")
    ap.add_argument("--model", help="model shape (default: the record's, else llama-3.1-8b)")
    ap.add_argument("--machine", help="provenance: the machine (default: the record's device)")
    ap.add_argument("--engine-version", help="provenance: the engine (default: the record's)")
    ap.add_argument("--prompt-len", type=int, help="for logs without ctx_tokens")
    ap.add_argument("--output-len", type=int, help="for logs without ctx_tokens")
    ap.add_argument("--hardware", type=Path, help=argparse.SUPPRESS)  # tests: another file
    ap.add_argument("--bench", type=Path, help="bench.json from workbench.bench.mini")
    ap.add_argument("--sweep", type=Path, action="append", default=[],
                    help="a folder of repeat_<r>.json from the colocation lab's gpu sweep "
                         "(out_dir); repeatable, the repeats are merged")
    ap.add_argument("--no-sweep-steps", action="store_true",
                    help="fit on --bench's steps only, not on the sweep's")
    ap.add_argument("--what-if", default=None,
                    help="key=value,... step-time overrides (e.g. step_overhead_s=0.005): the "
                         "same points simulated again with them, speedups printed")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    args.argv = argv
    if not args.sweep and not args.bench and not args.inputs:
        print("error: nothing to fit: no steps were given. Fix: pass step logs or a real "
              "record, --sweep DIR (a colocation sweep's out_dir) or --bench FILE (bench mini's "
              "JSON)", file=sys.stderr)
        return 2
    if args.out:
        check(args.out)  # before the fit
    from workbench.errors import WorkbenchError

    if args.inputs:
        try:
            calibrate_real.run(args)
        except WorkbenchError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except OSError as err:  # hardware.py not writable
            print(f"error: {ascii(str(err))[1:-1]}", file=sys.stderr)
            return 2
        return 0
    from workbench.labs.colocation.params import reading_sweep

    try:  # the sweep and bench files are outside input: a bad one is one line
        with reading_sweep(f"--sweep {' '.join(map(str, args.sweep))} --bench {args.bench}"):
            _calibrate(args)
    except WorkbenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # --out not writable
        print(f"error: {ascii(str(err))[1:-1]}", file=sys.stderr)
        return 2
    return 0


def _calibrate(args: argparse.Namespace) -> None:
    from workbench.bench import simgpu
    from workbench.labs.colocation.params import load_repeats, read_json_file

    reps = [r for d in args.sweep for r in load_repeats(d)]
    steps: list = []
    if args.bench:
        b = read_json_file(args.bench, "--bench file", "pass the JSON `bench mini` wrote")
        steps += b.get("steps", [])
        for r in b.get("decode", []):
            steps += r["steps"]
    if reps and not args.no_sweep_steps:
        steps += simgpu.sweep_steps(reps)
    # two step paths only where the decode was graphed; an eager engine has one
    fit = fit_steptime(steps, prefill_term=any(r.get("cuda_graphs", False) for r in reps))
    print(json.dumps(fit, indent=1))
    out: dict = {"fit": fit}
    if reps:
        gpu = simgpu.gpu_points(reps)
        sim = simgpu.sim_points(reps[0]["config"], fit, sorted(gpu))
        out["sim_vs_gpu"] = table = simgpu.side_by_side(gpu, sim)
        print(f"{len(reps)} repeat(s); GPU: median [min-max] over repeats; TTFT ms")
        print(simgpu.table_md(table))
        print("\nSim, fitted step time:")
        print(simgpu.speedups_md(sim))
        if args.what_if:
            from workbench.labs.kit.steptime import parse_steptime

            what = {**fit, **parse_steptime(args.what_if)}
            alt = simgpu.sim_points(reps[0]["config"], what, sorted(gpu))
            out["what_if"] = {"overrides": args.what_if,
                              "sim": {f"{p}/{m}": v for (p, m), v in alt.items()}}
            print(f"\nSim, what if {args.what_if}:")
            print(simgpu.speedups_md(alt))
    if args.out:
        write_text(args.out, dumps(out, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(run_main(main))
