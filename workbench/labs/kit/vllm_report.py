"""What the labs' real-engine reports share: the record of a run on a real vLLM or SGLang (the
raw rows kept whole; ``out["engine"]`` names the kind, vLLM when absent) and its Markdown, the
seed's expectation beside what the engine did under a verdict."""

from __future__ import annotations

import time
from collections.abc import Callable

from workbench.labs.kit.base import LabResult
from workbench.labs.kit.record import LabRecord, Manifest

TITLES = {"vllm": "real vLLM", "sglang": "real SGLang", "vllm+sglang": "real vLLM + real SGLang"}
SERVERS = {"vllm": "real vLLM through its OpenAI server",
           "sglang": "real SGLang through its native /generate (token ids)",
           "vllm+sglang": "real vLLM (OpenAI server) and real SGLang (/generate, token ids)"}
MODELS = {"vllm": "tiny-llama (2 layers, random weights)",
          "sglang": "tiny-llama (4 layers, random weights from config.json)"}


def kind_of(out: dict) -> str:
    return out.get("engine", "vllm")


def real_record(lab: str, out: dict, hypothesis: str, verdict: str, headline: str,
                mechanism: str, kv: dict, tables: dict,
                cache_state: str = "prefix cache on") -> LabRecord:
    kind = kind_of(out)
    return LabRecord(
        experiment_id=lab, hypothesis=hypothesis,
        environment={"backend": out["backend"], "device": out["device"], "engine": kind},
        model_io={"model": out.get("model_text") or MODELS.get(kind, kind)},
        cache_state=cache_state,
        load={}, samples={}, outcomes={"headline": headline}, ttft={}, tpot_itl={}, e2e={},
        throughput={}, slo_goodput={}, hits={}, transfer_bytes=None, phase_times=None, kv=kv,
        correctness=verdict, raw_data={"run": out}, verdict=verdict, mechanism=mechanism,
        open_questions=[], applicability=f"{SERVERS.get(kind, kind)}, one process per engine",
        manifest=Manifest.collect(hardware={"device": out["device"]},
                                  engine_config={"engine": kind}, kvcached_config={},
                                  backend=out["backend"]),
        results=tables)


def real_markdown(title: str, rows: list[tuple[str, str]], table: list[dict],
                  verdict: str, kind: str = "vllm") -> str:
    lines = [f"# {title} ({TITLES.get(kind, kind)})", "", f"**Verdict:** {verdict}", "",
             "| the seed expects | the real engine did |", "|---|---|"]
    lines += [f"| {a} | {b} |" for a, b in rows]
    if table:
        keys = list(table[0])
        lines += ["", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in table]
    return "\n".join(lines) + "\n"


def real_result(report: Callable[[dict], tuple[LabRecord, str]],
                runner: Callable[[], dict]) -> LabResult:
    """Run a lab's real-vLLM runner, then its report: the lab's result, with the run's wall
    time in the record."""
    t0 = time.monotonic()
    rec, md = report(runner())
    rec.raw_data["wall_s"] = round(time.monotonic() - t0, 1)
    return LabResult(rec, md, tables=rec.results)
