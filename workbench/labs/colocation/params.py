"""The colocation lab's data, below its runners and its report: the parameters
(:class:`ColocationParams`), what a runner hands the report (:class:`ColocationRun`, the two
modes, the spread over repeats), and a sweep's saved repeats read back (``from_dir``: an
out_dir's ``repeat_<r>.json`` files or a saved ``.repeats.json.gz``, several merged), every
field of them outside input."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from workbench.engines import kinds
from workbench.engines.metrics import SLO
from workbench.errors import ConfigError, WorkbenchError
from workbench.labs.kit.params import ENGINE, GIB, MODEL, QUICK, SEED, STEPTIME, TOKENS
from workbench.ranges import Choice, Choices, Flag, Ints, Num, Opt, Spec, Text
from workbench.strictjson import read_file

# every way the lab holds the KV total: a static split, the workbench's elastic pool, and
# kvcached 0.1.6 itself (real vLLM only); PAIR is what every family runs unless told
MODES = ("static", "elastic", "kvcached")
PAIR = MODES[:2]
# the real-vLLM sweep's settings: kvcached's ramp time-compressed at a 2 GiB total, or
# kvcached's own (unscaled ramp, 256/256 tokens, the KV its A100-80G run left)
SETTINGS = ("compressed", "kvcached")


@dataclass(slots=True)
class ColocationParams:
    peaks: tuple[int, ...] | None = None  # None: sim 12..20, gpu/host 2,6,12 (before scaling)
    quick: bool = False  # sim: PEAK 12, 16, 20; gpu/host: the first two peaks
    seed: int = 0
    steptime: str | None = None  # sim: a calibration name or key=value,... overrides
    workers: int | None = None  # sim: processes for the sweep
    model: str | None = None  # gpu/host: registry name (default llama-3.1-8b; host: tiny)
    budget_gib: float = 2.0  # gpu/host: GiB of KV all instances hold together (compressed)
    time_scale: float = 4.0  # gpu/host: arrival times / scale, completions / scale (compressed)
    prompt_len: int = 256
    completion_len: int = 256  # before scaling
    repeats: int = 1  # gpu/host: runs of every (PEAK, mode); sim: seeds seed..seed+repeats-1
    first_repeat: int = 0  # gpu/host: index of the first repeat (even: static first, odd: elastic)
    out_dir: str | None = None  # gpu/host: each repeat's raw JSON lands here as the sweep goes
    from_dir: str | None = None  # gpu/host: build the report from the repeat JSONs in this folder
    mapper: bool = True  # gpu/host elastic: background mapper (reserve 1) vs inline maps (0..1)
    cuda_graphs: bool | None = None  # gpu: decode CUDA graphs (None: on; False: eager)
    engine: str | None = None  # none: sim-vllm on sim, mini on host/gpu; vllm: real vLLMs
    together: bool | None = None  # vllm: both modes' engines up all run (None: gpu yes, host no)
    deadline_s: float | None = None  # vllm: start no point past this many seconds of wall time
    setting: str = "compressed"  # vllm: one of SETTINGS (kvcached: its budget, no time scale)
    modes: tuple[str, ...] | None = None  # vllm: None: PAIR (compressed), MODES (kvcached)
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "peaks": Opt(Ints(1, 10000)), "quick": QUICK, "seed": SEED, "steptime": Opt(STEPTIME),
        "workers": Opt(Num(int, 1, 32)), "model": Opt(MODEL), "budget_gib": GIB,
        "time_scale": Num(float, 0.01, 1000.0), "prompt_len": TOKENS, "completion_len": TOKENS,
        "repeats": Num(int, 1, 100), "first_repeat": Num(int, 0, 99),
        "out_dir": Opt(Text()), "from_dir": Opt(Text()), "mapper": Flag(),
        "cuda_graphs": Opt(Flag()), "together": Opt(Flag()),
        "engine": Opt(ENGINE("sim-vllm", "mini", "vllm")),  # None: sim-vllm on sim, else mini
        "deadline_s": Opt(Num(float, 1.0, 86400.0, "s")),
        "setting": Choice(SETTINGS), "modes": Opt(Choices(MODES, len(MODES))),
    }


def sweep_modes(params: ColocationParams) -> tuple[str, ...]:
    """The modes a run sweeps: those named, else the pair, or all three at kvcached's setting."""
    return params.modes or (MODES if params.setting == "kvcached" else PAIR)


@dataclass(slots=True)
class ColocationRun:
    """What a backend hands back: the (PEAK, mode) summaries plus its own record fields."""

    backend: str
    peaks: list[int]
    overall: dict[tuple[int, str], list[dict]]  # (peak, mode) -> Summary.as_dict() per repeat
    title: str
    setup: list[str]  # Markdown paragraphs under the title
    footer: list[str]  # Markdown after the tables
    record: dict[str, Any]  # LabRecord fields only this backend knows
    results: dict[str, Any] = field(default_factory=dict)
    time_scale: float | None = None  # None: unscaled PEAKs, comparable to kvcached's table
    slo: str = SLO().describe()  # the bounds goodput counts (both backends summarise with it)


def spread(values: list[float]) -> dict[str, float]:
    """Median and range of one quantity over repeats."""
    v = sorted(values)
    n = len(v)
    med = v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
    return {"median": med, "min": v[0], "max": v[-1]}


@contextmanager
def reading_sweep(what: str) -> Iterator[None]:
    """Reading repeat records from files: a field missing or of the wrong type anywhere in them
    becomes one ConfigError line naming ``what``, not a traceback."""
    try:
        yield
    except WorkbenchError:  # already one line (a refused file, a bad option)
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError,
            RecursionError) as err:
        detail = ascii(f"{type(err).__name__}: {err}")[1:-1][:120]
        raise ConfigError(what, f"holds a record this version cannot read ({detail})",
                          "rerun the sweep with this version, or point at another out_dir"
                          ) from None


# -- a sweep's saved repeats, read back --------------------------------------------------------

MAX_REPEAT_BYTES = 256 << 20  # a repeat file of the sweep is a few MB


def load_repeats(folder: str | Path) -> list[dict]:
    """The ``repeat_<r>.json`` files a sweep wrote (several calls' folders may be merged into
    one), in repeat order. The files come from outside this process: each must be a regular
    file of sane size holding a JSON object with ``config`` and ``runs``; anything else is one
    ConfigError line (what else a record lacks, :func:`reading_sweep` turns into one too)."""
    found = []
    for p in Path(folder).glob("repeat_*.json"):
        index = p.stem[len("repeat_"):]
        if index.isdigit() and len(index) <= 6:
            found.append((int(index), p))
    if not found:
        raise ConfigError(f"from_dir={str(folder)!r}", "holds no repeat_<r>.json",
                          "point it at the out_dir of a gpu/host sweep")
    return [_read_repeat(p) for _, p in sorted(found)]


def read_json_file(path: Path, what: str, fix: str) -> object:
    """A JSON file from outside the process, strictly (:func:`workbench.strictjson.read_file`):
    a regular file (no link) of sane size that parses, or one ConfigError line (``what``: how
    the error names it)."""
    return read_file(path, what, fix, MAX_REPEAT_BYTES)


def _read_repeat(path: Path) -> dict:
    fix = "point from_dir (or --sweep) at the out_dir of a gpu/host sweep"
    data = read_json_file(path, "sweep file", fix)
    if not (isinstance(data, dict) and isinstance(data.get("config"), dict)
            and isinstance(data.get("runs"), dict)):
        raise ConfigError(f"sweep file {path}", "is not a repeat record (no config and runs)",
                          fix)
    return data


def read_sweep(where: str | Path) -> list[dict]:
    """One sweep's repeats: a folder of ``repeat_<r>.json`` files, or a ``.json.gz`` holding
    their list (the raw data kept beside a saved record)."""
    p = Path(where)
    if not p.name.endswith(".json.gz"):
        return load_repeats(p)
    fix = "point from_dir at a sweep's out_dir or its saved .json.gz"
    data = read_file(p, "sweep file", fix, MAX_REPEAT_BYTES)
    if not (isinstance(data, list) and data and all(isinstance(r, dict) and "runs" in r
                                                   and "config" in r for r in data)):
        raise ConfigError(f"sweep file {p}", "is not a list of repeat records", fix)
    return data


def merged(folders: str) -> list[dict]:
    """The repeats of one or more sweeps (``a,b``: folders or saved ``.json.gz``): a repeat in
    several is taken from the one with more points (a repeat cut short in one call, rerun in
    the next)."""
    best: dict[int, dict] = {}
    for folder in [f for f in folders.split(",") if f]:
        for rep in read_sweep(folder):
            r = int(rep["repeat"])
            if r not in best or len(rep["runs"]) > len(best[r]["runs"]):
                best[r] = rep
    return [best[r] for r in sorted(best)]


def server_kind(engine: object) -> bool:
    """Whether a record's engine names a server kind (a real engine's sweep)."""
    kind = kinds.REGISTRY.get(engine) if isinstance(engine, str) else None
    return kind is not None and kind.family == "server"


def saved_family(from_dir: str) -> str:
    """The engine family of the sweep ``from_dir`` (its first folder) holds: ``server`` for a
    real engine's repeats, else ``mini``."""
    return "server" if server_kind(read_sweep(from_dir.split(",")[0])[0].get("engine")) else "mini"
