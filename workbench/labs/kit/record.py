"""The lab result record: the unified result table of seed 003 §12 plus the version manifest of
seed 000 §2. One JSON object per run; other labs build the same record.

Fields a simulated run cannot fill (external-cache bytes, H2D time, quality) stay ``None`` rather
than a made-up zero, so a reader sees what was not measured.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workbench import outfiles, strictjson
from workbench.manifest import software

SCHEMA = "workbench.lab-record/1"


@dataclass(slots=True)
class Manifest:
    """Seed 000 §2: what must be recorded for a run to be reproducible."""

    hardware: dict[str, Any] = field(default_factory=dict)  # GPU model/count/VRAM, driver
    software: dict[str, Any] = field(default_factory=dict)  # python, torch, engine, workbench+git
    engine_config: dict[str, Any] = field(default_factory=dict)  # model, dtype, TP/PP, block...
    kvcached_config: dict[str, Any] = field(default_factory=dict)  # IPC, page, layout, prealloc..

    @classmethod
    def collect(cls, *, hardware: dict, engine_config: dict, kvcached_config: dict,
                backend: str = "sim") -> Manifest:
        """The software part comes from :func:`workbench.manifest.software` (doctor's too)."""
        return cls(hardware, software(backend), engine_config, kvcached_config)


@dataclass(slots=True)
class LabRecord:
    """Seed 003 §12, one field per line of the unified result table."""

    experiment_id: str
    hypothesis: str
    environment: dict[str, Any]  # environment and config files
    model_io: dict[str, Any]  # model and actual input/output length distribution
    cache_state: str  # cold/warm, local/external hit control
    load: dict[str, Any]  # concurrency or arrival rate / actual send rate
    samples: dict[str, Any]  # sample count / repeats / order
    outcomes: dict[str, Any]  # success / failure / rejected requests
    ttft: dict[str, Any]  # P50/P95/P99 (and mean)
    tpot_itl: dict[str, Any]
    e2e: dict[str, Any]
    throughput: dict[str, Any]  # input tok/s, output tok/s, req/s
    slo_goodput: dict[str, Any]
    hits: dict[str, Any]  # local / external hits and their denominators
    transfer_bytes: dict[str, Any] | None  # saved/retrieved bytes, bandwidth
    phase_times: dict[str, Any] | None  # lookup / IO / H2D / reorder / queueing
    kv: dict[str, Any]  # KV usage / preemptions / lease timeouts / fallback recompute
    correctness: str | None
    raw_data: dict[str, Any]  # raw data / trace / log paths
    verdict: str  # hypothesis supported or refuted
    mechanism: str
    open_questions: list[str]
    applicability: str
    manifest: Manifest
    results: dict[str, Any] = field(default_factory=dict)  # the lab's own tables
    schema: str = SCHEMA

    def to_json(self, indent: int | None = 2) -> str:
        """Strict JSON: a value that is not a finite number is null, named in ``notes``."""
        return strictjson.dumps(asdict(self), indent=indent, default=_jsonable)

    def files(self, path: str | os.PathLike, markdown: str | None = None
              ) -> list[tuple[Path, str]]:
        """(path, text) of the JSON record and, if given, the Markdown report beside it."""
        paths = destinations(path, markdown is not None)
        self.raw_data.setdefault("record", str(paths[0]))
        texts = [self.to_json() + "\n", *([markdown] if markdown is not None else [])]
        return list(zip(paths, texts, strict=True))

    def write(self, path: str | os.PathLike, markdown: str | None = None) -> list[Path]:
        """Write the record and its report, both or neither (:mod:`workbench.outfiles`)."""
        return outfiles.write_all(self.files(path, markdown))


def destinations(path: str | os.PathLike, report: bool = True,
                 outputs: outfiles.Outputs | None = None) -> list[Path]:
    """The record's path and its report's (``.md`` beside it), checked as one run's outputs
    (``outputs``: with the run's other files): ``--out X.md`` would put the report over the
    record, and is refused."""
    outputs = outputs or outfiles.Outputs()
    p = outputs.add(path, "--out")
    return [p, *([outputs.add(p.with_suffix(".md"), "--out's report", "report")] if report
                  else [])]


def _jsonable(x: Any) -> Any:
    if hasattr(x, "_asdict"):
        return x._asdict()
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)
