"""Real vLLM's speed, stock against elastic on the same process layout: prefill time against
prompt length, and TPOT of a model shape (random weights, ``load_format="dummy"``) at several
batch sizes against its weights-read floor (weight bytes ÷ the HBM bandwidth measured in the
same run).

Two worker processes, one engine each (stock, then elastic with autopatch armed), both kept
alive; the coordinator asks them for one point at a time, interleaved (the mode order
alternates every repeat), so a drift of the machine hits both alike. Each engine runs vLLM's
defaults (its attention backend, torch.compile, CUDA graphs, its engine core in a process of its
own: ``--engine-core in-process`` keeps it in the worker); only the sizes are set. The record
names the vLLM build (compiled ops or stand-in), the runner, the attention backend and where the
engine core ran.

    python -m workbench.bench.vllm_speed [--model llama-3.1-8b] [--repeats 5] [--out DIR]

A prefill point is one request of L tokens asking for one token (time to its first token),
asked ``--samples`` times a repeat with the modes alternating sample by sample; a
TPOT point is B requests of ``--context`` tokens asking for ``1 + --decode`` tokens: the time
from every request's first token to the last one's finish, over ``--decode``. A low-load point
(``--lowload N``) is N requests of ``--context`` tokens sent one at a time, ``--gap-ms`` apart
with the engine idle in between, each asking for ``--lowload-tokens``: their mean and p99 time
to first token (the modes alternating request by request, as a prefill point's samples do).
Every elastic point also says what the pool did on its path: page transitions by cause and the
host time spent in maps and unmaps. The table, verdicts and Markdown are
``vllm_speed_report``'s.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workbench.bench.vllm_speed_report import MODES, markdown, points, summarize, verdicts
from workbench.errors import ConfigError
from workbench.outfiles import Outputs, open_stream, run_main, write_all
from workbench.settings import ENV_PREFIX
from workbench.strictjson import dumps
from workbench.units import GiB

OUT_FILES = ["vllm_speed.json", "vllm_speed.md", "vllm_speed.jsonl", *(f"{m}.log" for m in MODES)]
MARK = "@@"  # a protocol line among vLLM's own log lines on stdout


# ---- the worker: one engine, answering points --------------------------------------------

def _engine(args):
    from vllm import LLM

    return LLM(model=args.model_dir, skip_tokenizer_init=True, load_format="dummy",
               dtype="bfloat16", seed=0, max_model_len=args.max_len,
               max_num_seqs=max(args.batches), gpu_memory_utilization=args.util,
               enable_prefix_caching=False, disable_log_stats=False)  # stats: the core's times


def _backends(runner) -> list[str]:
    """The attention backends the runner's layers use (V1: ``attn_groups``)."""
    names = set()
    for groups in getattr(runner, "attn_groups", None) or []:
        for g in groups:
            names.add(g.backend.get_name())
    return sorted(names) or ["unknown"]


def _core_facts(worker) -> dict:
    """What ran, read where the model runner is (the engine-core process, or this one): build,
    runner, attention, compilation and graphs, sizes, weight bytes. Called through vLLM's
    ``collective_rpc``, which hands it the worker."""
    from workbench.engines.real.vllm_build import build

    cfg = worker.vllm_config
    cc, runner = cfg.compilation_config, worker.model_runner
    model = runner.get_model()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    try:
        attention = _backends(runner)
    except Exception as exc:  # a record field, never a failed run
        attention = [f"unknown ({type(exc).__name__})"]
    return {"build": build(),
            "runner": f"{type(runner).__module__}.{type(runner).__name__}",
            "v2_model_runner": os.environ.get("VLLM_USE_V2_MODEL_RUNNER", ""),
            "attention": attention, "compile_mode": getattr(cc.mode, "name", str(cc.mode)),
            "cudagraph_mode": str(cc.cudagraph_mode), "custom_ops": list(cc.custom_ops),
            "compile_s": round(float(cc.compilation_time or 0.0), 2),
            "max_cudagraph_capture_size": cc.max_cudagraph_capture_size,
            "max_num_batched_tokens": cfg.scheduler_config.max_num_batched_tokens,
            "async_scheduling": bool(cfg.scheduler_config.async_scheduling),
            "block_size": cfg.cache_config.block_size,
            "num_gpu_blocks": cfg.cache_config.num_gpu_blocks,
            "weight_bytes": int(weights),
            "embedding_bytes": int(embed.weight.numel() * embed.weight.element_size())
            if embed is not None else 0}


def facts(llm, init_s: float) -> dict:
    return {**in_core(llm, "_core_facts"), "init_s": round(init_s, 1),
            "engine_core": "process" if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
            != "0" else "in-process"}


def _ids(n: int, length: int, salt: int) -> list[list[int]]:
    """``n`` distinct prompts of ``length`` ids (no shared prefix; ``salt`` varies them)."""
    return [[(7 + 31 * (i + 97 * salt) + 17 * j) % 30000 + 5 for j in range(length)]
            for i in range(n)]


def drive(engine, prompts: list[list[int]], new_tokens: int, tag: str) -> dict:
    """Add every prompt at once and step until all finish; host-clock times (each step
    returns after the GPU's work is read back)."""
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True,
                        detokenize=False)
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", {"prompt_token_ids": p}, sp)
    first: dict[str, float] = {}
    core: dict[str, float] = {}
    ids: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        outs = engine.step()
        now = time.perf_counter()
        for o in outs:
            if o.outputs and o.outputs[0].token_ids and o.request_id not in first:
                first[o.request_id] = now
                core[o.request_id] = core_first_token_s(o)
            if o.finished:
                ids[o.request_id] = list(o.outputs[0].token_ids)
    end = time.perf_counter()
    order = sorted(ids, key=lambda k: int(k.split("-")[1]))  # vLLM may add a suffix
    return {"t_first": max(first.values()) - t0, "t_end": end - t0,
            "core_first": max(core.values()),
            "tokens": sum(len(ids[k]) for k in order),
            "tokens_sha": hashlib.sha256(json.dumps([ids[k] for k in order]).encode())
            .hexdigest()[:12]}


def core_first_token_s(out) -> float:
    """A request's time to its first token in the engine core's own clock: from the moment its
    scheduler queued it to the step output that carried the token (vLLM's request stats, both
    ends stamped in the engine-core process). What the pool does on the request path is inside
    it; the hops between this process and the engine core's are not. NaN without the stats."""
    m = getattr(out, "metrics", None)
    if m is None or not getattr(m, "queued_ts", 0.0) or not getattr(m, "first_token_ts", 0.0):
        return float("nan")
    return m.first_token_ts - m.queued_ts


def point(llm, kind: str, n: int, args, seq: int, probe: PoolProbe) -> dict:
    engine = llm.llm_engine
    if kind == "lowload":  # one request of the point's n, the engine idle before it
        time.sleep(args.gap_ms / 1e3)
    before = probe.snapshot()
    if kind == "prefill":
        r = drive(engine, _ids(1, n, seq), 1, f"p{seq}")
        out = {"seconds": r["t_first"], "core_s": r["core_first"]}
    elif kind == "lowload":
        r = drive(engine, _ids(1, args.context, seq), args.lowload_tokens, f"l{seq}")
        out = {"seconds": r["t_first"], "core_s": r["core_first"]}
    else:
        r = drive(engine, _ids(n, args.context, seq), 1 + args.decode, f"d{seq}")
        out = {"seconds": (r["t_end"] - r["t_first"]) / args.decode, "ttft_s": r["t_first"]}
    out.update(tokens=r["tokens"], tokens_sha=r["tokens_sha"])
    pool = probe.since(before)
    if pool is not None:
        out["pool"] = pool
    return out


class MapClock:
    """The elastic pool's work, observed: the ledger's page transitions by cause (map, prealloc,
    reuse, park, retire, unmap, ...) and the host seconds inside the virtual range's map and
    unmap calls (wrapped here; the library is unchanged), kept apart by where they ran: inside
    the scheduler's calls (allocations, frees, free-block counts), in a step's refill while its
    forward pass runs (``step-refill``), or in the idle loop (``idle-tidy``)."""

    WHERE = ("", "_step", "_idle")

    def __init__(self, kv):
        self.kv, self.where = kv, ""
        self.seconds = {f"{k}{w}": 0.0 for k in ("map", "unmap") for w in self.WHERE}
        space = kv.pages.space
        for name, key in (("map_page", "map"), ("prepare_unmap", "unmap"),
                          ("commit_unmap", "unmap")):
            setattr(space, name, self._timed(getattr(space, name), key))
        for name, where in (("refill_in_step", "_step"), ("tidy", "_idle")):
            setattr(kv, name, self._during(getattr(kv, name), where))

    def _timed(self, fn, key):
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.seconds[key + self.where] += time.perf_counter() - t0
        return timed

    def _during(self, fn, where):
        def during(*a, **k):
            self.where = where
            try:
                return fn(*a, **k)
            finally:
                self.where = ""
        return during

    @staticmethod
    def attach() -> MapClock | None:
        try:
            from workbench.adapters.vllm import registry
        except ImportError:
            return None
        return MapClock(registry.ledgers[-1][1]) if registry.ledgers else None

    def snapshot(self) -> dict:
        """Where the pool's event log and the map clocks stand now (read off the timed path:
        counting by cause waits for :meth:`since`, over the events after this mark alone)."""
        return {"at": len(self.kv.events), **self.seconds}

    def since(self, before: dict) -> dict:
        causes: dict[str, int] = {}
        for e in self.kv.events.events[before["at"]:]:
            if e.page >= 0:
                cause = e.cause.split("@")[0]
                causes[cause] = causes.get(cause, 0) + 1
        return {"causes": causes, **{f"{k}_ms": round((v - before[k]) * 1e3, 3)
                                     for k, v in self.seconds.items()},
                "mapped_bytes": self.kv.mapped_bytes}


@functools.cache
def _clock() -> MapClock | None:
    """This process's map clock (the engine core's), attached on first use."""
    return MapClock.attach()


def _clock_ask(worker, op: str, before: dict | None = None) -> dict | None:
    """``snapshot`` or ``since``, run where the pool is (through ``collective_rpc``, like
    :func:`_core_facts`); None where no elastic pool was built (stock)."""
    clock = _clock()
    if clock is None or (op == "since" and before is None):
        return None
    return clock.snapshot() if op == "snapshot" else clock.since(before)


def in_core(llm, name: str, *args):
    """This module's function ``name`` run where the model runner is (the engine-core process,
    or this one), through vLLM's ``collective_rpc``, which hands it the worker. Named through
    the module's import name: run as ``-m`` this file is ``__main__``, whose functions vLLM's
    cloudpickle would send by value, globals and all (a fresh map clock on every call)."""
    fn = getattr(importlib.import_module(__spec__.name if __spec__ else __name__), name)
    return llm.collective_rpc(fn, args=args)[0]


class PoolProbe:
    """The bench's side of the map clock: ``snapshot`` / ``since`` asked of the process the
    pool is in. Stock is asked the same round trips (and answers None), so both modes see the
    same calls around each request."""

    def __init__(self, llm):
        self.llm = llm

    def snapshot(self) -> dict | None:
        return in_core(self.llm, "_clock_ask", "snapshot")

    def since(self, before: dict | None) -> dict | None:
        return in_core(self.llm, "_clock_ask", "since", before)


def worker(args) -> int:
    t0 = time.time()
    llm = _engine(args)
    _say("READY", facts(llm, time.time() - t0))
    probe = PoolProbe(llm)
    for seq, line in enumerate(sys.stdin):
        ask = json.loads(line)
        if ask.get("stop"):
            break
        _say("RESULT", point(llm, ask["kind"], ask["n"], args, seq, probe))
    return 0


def _say(tag: str, payload: dict) -> None:
    print(f"{MARK}{tag} {json.dumps(payload)}", flush=True)


# ---- the coordinator -------------------------------------------------------------------

def hbm_bandwidth(gib: float = 2.0, repeats: int = 20) -> dict:
    """Device-to-device copy of ``gib`` GiB of random bf16 (bytes read + written), CUDA
    events, median of ``repeats`` after a warm-up; the buffers are freed after."""
    import torch

    n = int(gib * GiB) // 2
    src = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    gbps = [4 * n / t / 1e9 for t in times]
    return {"gb_per_s": round(statistics.median(gbps), 1), "p10": round(min(gbps), 1),
            "max": round(max(gbps), 1), "bytes_per_copy": 4 * n, "device":
            torch.cuda.get_device_name(0)}


class Worker:
    """One engine process; ``ask`` sends a point and waits for its answer."""

    def __init__(self, mode: str, args, log_dir: Path):
        env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
        # the engine core in a process of its own is vLLM's default (and what its idle loop,
        # where the pool tidies, needs); the bench's facts and map clock reach it through
        # collective_rpc, whose function argument vLLM sends pickled only when allowed
        env.update(VLLM_ENABLE_V1_MULTIPROCESSING="1" if args.engine_core == "process" else "0",
                   VLLM_ALLOW_INSECURE_SERIALIZATION="1")
        if mode == "elastic" and not args.control:
            env.update(WORKBENCH_KV_AUTOPATCH="1", WORKBENCH_KV_IPC_NAME=f"vspeed_{os.getpid()}",
                       **pool_env(args.pool))
        cmd = [sys.executable, "-m", "workbench.bench.vllm_speed", "--worker", mode,
               "--model-dir", args.model_dir, *_passthrough(args)]
        self.mode, self.log = mode, open_stream(log_dir / f"{mode}.log")
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.facts = self._read("READY")

    def _read(self, tag: str) -> dict:
        for line in self.proc.stdout:
            if line.startswith(f"{MARK}{tag} "):
                return json.loads(line[len(MARK) + len(tag) + 1:])
            self.log.write(line)
        self.log.flush()
        raise RuntimeError(f"{self.mode} worker ended (rc {self.proc.wait()}); see its log")

    def ask(self, kind: str, n: int) -> dict:
        self.proc.stdin.write(json.dumps({"kind": kind, "n": n}) + "\n")
        self.proc.stdin.flush()
        return self._read("RESULT")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps({"stop": True}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=120)
        self.log.close()


def pool_env(pairs: list[str]) -> dict[str, str]:
    """``--pool NAME=VALUE`` as the elastic worker's ``WORKBENCH_KV_NAME=VALUE`` (its settings
    check the name and the value when it starts, as any engine's do)."""
    out = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or not name.replace("_", "").isalnum() or not name.isascii():
            raise ConfigError(f"--pool {pair!r}", "is not NAME=VALUE with NAME of letters, "
                              "digits and _", "e.g. --pool MAX_RESERVED_PAGES=16")
        key = ENV_PREFIX + name.upper()
        out[key] = value
    return out


def _passthrough(args) -> list[str]:
    return ["--context", str(args.context), "--decode", str(args.decode),
            "--max-len", str(args.max_len), "--util", str(args.util),
            "--batches", ",".join(map(str, args.batches)), "--gap-ms", str(args.gap_ms),
            "--lowload-tokens", str(args.lowload_tokens)]


def sweep(workers: dict, args, log) -> list[dict]:
    """Every point in every repeat, the modes in alternating order; warm-up repeats first. A
    prefill point is asked ``args.samples`` times and a low-load point once per request, the
    order alternating sample by sample: the host's and the GPU clock's drift over seconds (a
    10 ms prefill moved by 30 % between one point and the next on the H200) then falls on both
    modes of a pair alike, and so does the cost of going second."""
    rows = []
    for rep in range(-args.warmup, args.repeats):
        for kind, n in points(args):
            for k in range({"prefill": args.samples, "lowload": n}.get(kind, 1)):
                flip = (rep + k) % 2
                for mode in [m for m in (MODES[::-1] if flip else MODES) if m in workers]:
                    r = {"repeat": rep, "sample": k, "mode": mode, "kind": kind, "n": n,
                         **workers[mode].ask(kind, n)}
                    rows.append(r)
                    log(json.dumps(r))
    return rows


def coordinate(args) -> dict:
    from workbench.engines.real import shapes

    out = Outputs().folder(args.out or "vllm_speed_out", OUT_FILES, "--out")  # before the run
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="vllm_speed_"))  # the model folder stays off OUT
    args.model_dir = str(shapes.write(work / f"{args.model}-dummy", work / "no-tokenizer",
                                      args.model, max_position=args.max_len))
    log_file = open_stream(out / "vllm_speed.jsonl")

    def log(s: str) -> None:
        print(s, flush=True)
        log_file.write(s + "\n")
        log_file.flush()

    bw = [hbm_bandwidth()]
    log(json.dumps({"bandwidth": bw[0]}))
    workers: dict[str, Worker] = {}
    errors: dict[str, str] = {}
    try:
        for mode in start_order(args):  # one after the other: the second finds the cache warm
            try:
                workers[mode] = Worker(mode, args, out)
            except RuntimeError as exc:  # stock alone still gives its figures
                errors[mode] = str(exc)
                log(json.dumps({"failed": mode, "error": str(exc)}))
                if mode == "stock":
                    raise
                continue
            log(json.dumps({"ready": mode, **workers[mode].facts}))
        rows = sweep(workers, args, log)
    finally:
        for w in workers.values():
            w.close()
    bw.append(hbm_bandwidth())
    facts_ = {m: w.facts for m, w in workers.items()}
    table = summarize(rows, facts_, bw, args)
    result = {"model": args.model, "command": " ".join(["python -m workbench.bench.vllm_speed",
                                                        *sys.argv[1:]]),
              "bandwidth": bw, "facts": facts_, "errors": errors, "table": table,
              "verdicts": verdicts(table),
              "repeats": args.repeats, "warmup": args.warmup, "samples": args.samples,
              "pool_settings": pool_env(args.pool), "control": args.control,
              "first": args.first,
              "rows": rows}
    write_all([(out / "vllm_speed.json", dumps(result, indent=1)),
               (out / "vllm_speed.md", markdown(result))])
    return result


def start_order(args) -> tuple[str, ...]:
    """The order the two engines start in (``--first``). In an A/A run on an H100 the engine
    started second read 2-4 % off the first at some points, beyond what interleaving cancels;
    A/A runs in both orders tell an offset that follows the start order from one that follows
    the process."""
    return MODES if args.first == MODES[0] else MODES[::-1]


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.1-8b", help="a registry model's shape")
    ap.add_argument("--prompt-lens", type=_ints, default=[128, 512, 2048, 8192])
    ap.add_argument("--batches", type=_ints, default=[1, 16, 64])
    ap.add_argument("--samples", type=int, default=8,
                    help="requests of a prefill point a repeat, the modes alternating")
    ap.add_argument("--context", type=int, default=128, help="prompt tokens of a TPOT point")
    ap.add_argument("--decode", type=int, default=128, help="decode steps of a TPOT point")
    ap.add_argument("--lowload", type=int, default=0,
                    help="requests of the low-load point (0: no such point)")
    ap.add_argument("--lowload-tokens", type=int, default=16,
                    help="tokens each low-load request asks for")
    ap.add_argument("--gap-ms", type=float, default=50.0,
                    help="idle time before each low-load request")
    ap.add_argument("--engine-core", choices=("process", "in-process"), default="process",
                    help="vLLM's engine core in a process of its own (its default) or in the "
                    "bench's worker (VLLM_ENABLE_V1_MULTIPROCESSING=0)")
    ap.add_argument("--control", action="store_true",
                    help="an A/A run: the 'elastic' engine is stock too, so its ratios are the "
                    "bench's own noise and order effects")
    ap.add_argument("--first", choices=MODES, default=MODES[0],
                    help="which engine starts first (the second finds vLLM's compile cache "
                    "warm)")
    ap.add_argument("--max-len", type=int, default=8448)
    ap.add_argument("--util", type=float, default=0.4, help="gpu_memory_utilization, each")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1, help="repeats run first, not counted")
    ap.add_argument("--pool", action="append", default=[], metavar="NAME=VALUE",
                    help="a setting of the elastic pool (WORKBENCH_KV_NAME), repeatable")
    ap.add_argument("--out", help="folder for vllm_speed.{json,md,jsonl} and the logs")
    ap.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.worker:
        return worker(args)
    pool_env(args.pool)  # refused before anything starts
    if args.control and args.pool:
        raise ConfigError("--pool with --control", "an A/A run starts no elastic pool to set",
                          "drop --pool, or --control")
    result = coordinate(args)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
