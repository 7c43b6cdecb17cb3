"""What the labs' server-runner reports share: the record of a run on real engine servers (the
raw rows kept whole; ``out["engine"]`` names the kind or kinds, ``a+b``, vLLM when absent) and
its Markdown, the seed's expectation beside what the engine did under a verdict. The words for
each kind come from its :class:`~workbench.engines.real.server.ServerEngine`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from workbench.engines import kinds
from workbench.labs.kit.base import LabResult
from workbench.labs.kit.record import LabRecord, Manifest

if TYPE_CHECKING:
    from workbench.engines.real.server import ServerEngine

def kind_of(out: dict) -> str:
    """The kind(s) a run's raw output names (a record written before kinds were named: vLLM)."""
    return out.get("engine", "vllm")


def _servers(kind: str) -> list[type[ServerEngine]]:
    return [kinds.get(n).server() for n in kind.split("+")]


def title(kind: str) -> str:
    """``real vLLM``, ``real vLLM + real SGLang``."""
    return " + ".join(s.title for s in _servers(kind))


def servers_text(kind: str) -> str:
    """How the run reached its engines, for the record's applicability."""
    servers = _servers(kind)
    if len(servers) == 1:
        return servers[0].server_text
    return " and ".join(s.server_short for s in servers)


def model_text(kind: str) -> str:
    servers = _servers(kind)
    return servers[0].model_text if len(servers) == 1 else kind


def build_facts(out: dict) -> dict[str, str]:
    """Each server kind's build on the run's device (vLLM: compiled ops or the stand-in, its
    runner, its attention), as the records and reports name it."""
    facts: dict[str, str] = {}
    for s in _servers(kind_of(out)):
        facts.update(s.build_facts(str(out.get("device", "")), out.get("runner")))
    return facts


def real_record(lab: str, out: dict, hypothesis: str, verdict: str, headline: str,
                mechanism: str, kv: dict, tables: dict,
                cache_state: str = "prefix cache on") -> LabRecord:
    kind = kind_of(out)
    return LabRecord(
        experiment_id=lab, hypothesis=hypothesis,
        environment={"backend": out["backend"], "device": out["device"], "engine": kind},
        model_io={"model": out.get("model_text") or model_text(kind)},
        cache_state=cache_state,
        load={}, samples={}, outcomes={"headline": headline}, ttft={}, tpot_itl={}, e2e={},
        throughput={}, slo_goodput={}, hits={}, transfer_bytes=None, phase_times=None, kv=kv,
        correctness=verdict, raw_data={"run": out}, verdict=verdict, mechanism=mechanism,
        open_questions=[], applicability=f"{servers_text(kind)}, one process per engine",
        manifest=Manifest.collect(hardware={"device": out["device"]},
                                  engine_config={"engine": kind, "build": build_facts(out)},
                                  kvcached_config={},
                                  backend=out["backend"]),
        results=tables)


def real_markdown(heading: str, rows: list[tuple[str, str]], table: list[dict],
                  verdict: str, kind: str = "vllm") -> str:
    lines = [f"# {heading} ({title(kind)})", "", f"**Verdict:** {verdict}", "",
             "| the seed expects | the real engine did |", "|---|---|"]
    lines += [f"| {a} | {b} |" for a, b in rows]
    if table:
        keys = list(table[0])
        lines += ["", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in table]
    return "\n".join(lines) + "\n"


def real_result(report: Callable[[dict], tuple[LabRecord, str]],
                runner: Callable[[], dict]) -> LabResult:
    """Run a lab's server runner, then its report: the lab's result, with the run's wall time
    in the record."""
    t0 = time.monotonic()
    rec, md = report(runner())
    rec.raw_data["wall_s"] = round(time.monotonic() - t0, 1)
    if facts := rec.manifest.engine_config.get("build"):  # under the verdict, as recorded
        head, sep, rest = md.partition("\n\n")
        md = f"{head}{sep}**Build:** {', '.join(f'{k} {v}' for k, v in facts.items())}\n\n{rest}"
    return LabResult(rec, md, tables=rec.results)
