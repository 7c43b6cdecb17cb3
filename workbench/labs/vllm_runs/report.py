"""Records and Markdown for the real-vLLM runs: the seed's expectation beside what the engine
did, a verdict, and one headline figure."""

from __future__ import annotations

from typing import Any

from workbench.labs.kit.record import LabRecord, Manifest

MiB = 1 << 20


def _record(lab: str, out: dict, hypothesis: str, verdict: str, headline: str,
            mechanism: str, kv: dict, tables: dict) -> LabRecord:
    return LabRecord(
        experiment_id=lab, hypothesis=hypothesis,
        environment={"backend": out["backend"], "device": out["device"], "engine": "vllm"},
        model_io={"model": "tiny-llama (2 layers, random weights)"}, cache_state="prefix cache on",
        load={}, samples={}, outcomes={"headline": headline}, ttft={}, tpot_itl={}, e2e={},
        throughput={}, slo_goodput={}, hits={}, transfer_bytes=None, phase_times=None, kv=kv,
        correctness=verdict, raw_data={"run": out}, verdict=verdict, mechanism=mechanism,
        open_questions=[], applicability="real vLLM through its OpenAI server, one process "
        "per engine", manifest=Manifest.collect(hardware={"device": out["device"]},
                                                engine_config={"engine": "vllm"},
                                                kvcached_config={}, backend=out["backend"]),
        results=tables)


def _md(title: str, rows: list[tuple[str, str]], table: list[dict], verdict: str) -> str:
    lines = [f"# {title} (real vLLM)", "", f"**Verdict:** {verdict}", "",
             "| the seed expects | the real engine did |", "|---|---|"]
    lines += [f"| {a} | {b} |" for a, b in rows]
    if table:
        keys = list(table[0])
        lines += ["", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in table]
    return "\n".join(lines) + "\n"


def output_equality(out: dict[str, Any]) -> tuple[LabRecord, str]:
    rows = out["rows"]
    equal = sum(r["equal"] for r in rows)
    total = sum(r["prompts"] for r in rows)
    lost = sum(r["lost"] for r in rows)
    ok = equal == total and lost == 0
    small = out["engines"]["small"]
    pre = (small.get("stock", {}).get("num_preemptions", "?"),
           small.get("elastic", {}).get("num_preemptions", "?"))
    noise = [r for r in rows if "stock_vs_stock" in r]
    stock_diff = sum(r["prompts"] - r["stock_vs_stock"] for r in noise)
    verdict = ("supported: elastic KV gave stock's tokens for every prompt" if ok else
               f"refuted: {total - equal} of {total} prompts differ ({lost} lost)")
    if not ok and noise and stock_diff > 0 and lost == 0:
        verdict = (f"inconclusive: {total - equal} of {total} prompts differ, and a second stock "
                   f"engine differs from the first on {stock_diff} (batching changes bf16 sums)")
    headline = f"{equal}/{total} prompts token-equal"
    md = _md("Output equality", [
        ("greedy tokens equal, elastic vs stock", f"{headline} over {len(rows)} cases"),
        ("prefix caching changes nothing", next((f"{r['equal']}/{r['prompts']}" for r in rows
                                               if "prefix" in r["case"]), "-")),
        ("seeded sampling reproducible", next((f"{r['equal']}/{r['prompts']}" for r in rows
                                              if "seeded" in r["case"]), "-")),
        ("stock reproduces itself (a second stock engine, the same waves)",
         ", ".join(f"{r['case']}: {r['stock_vs_stock']}/{r['prompts']}" for r in noise)
         or "not run"),
        ("a preempted and recomputed request gives the same tokens",
         f"small pool ({out['small_blocks']} blocks, limit {out['limit']}): preemptions "
         f"stock {pre[0]}, elastic {pre[1]}"),
    ], rows, verdict)
    rec = _record("output-equality", out, "elastic KV changes where the bytes live, not what "
                  "vLLM computes", verdict, headline, "both engines run vLLM's own kernels on "
                  "views of the same shape; only the memory under them differs",
                  {"engines": out["engines"]}, {"equality": rows})
    return rec, md


def dynamic_limit(out: dict[str, Any]) -> tuple[LabRecord, str]:
    steps = out["steps"]
    answers = sorted({s.get("answer", "?") for s in steps})
    page = out["page_id_bytes"]
    halve = next(s for s in steps if s["step"] == "halve")
    freed = (halve["mapped_before"] - (halve.get("mapped_settled") or 0))
    moved = (halve.get("free_after") or 0) - halve["free_before"]
    lost = out["requests"] - out["finished"]
    ok = lost == 0 and halve.get("answer") == "acknowledged"
    verdict = ("supported: the limit was acknowledged mid-run and no request was lost" if ok
               else f"refuted: {lost} requests lost; first answer {halve.get('answer')}")
    settled = (halve.get("mapped_settled") or 0) / MiB
    pre = int(out.get("counters", {}).get("num_preemptions", 0))
    headline = (f"limit {halve['requested'] / MiB:.0f} MiB {halve.get('answer')} "
                f"({halve.get('outcome')}); mapped {halve['mapped_before'] / MiB:.0f} -> "
                f"{settled:.0f} MiB; {out['finished']}/{out['requests']} finished, {pre} "
                f"preemptions; device free moved {moved / MiB:+.0f} MiB")
    md = _md("Dynamic limit", [
        ("a limit from another process is answered", ", ".join(answers)),
        ("no request is lost", f"{out['finished']}/{out['requests']} finished in full"),
        ("device free memory moves by the pages freed",
         f"pages freed {freed / MiB:.0f} MiB ({freed // page if page else 0} page ids), "
         f"device free moved {moved / MiB:+.0f} MiB"
         + (" (host MemAvailable: other processes move it too)" if out["device"] == "cpu"
            else "")),
        ("a superseded request says by which", next((s.get("answer", "") for s in steps
                                                   if s["step"] == "two writers"), "-")),
    ], [{k: s.get(k) for k in ("step", "requested", "answer", "outcome", "mapped_before",
                                "mapped_settled", "s")} for s in steps], verdict)
    rec = _record("dynamic-limit", out, "a limit set mid-run is applied without losing work",
                  verdict, headline, "the pool applies the segment's request on its next "
                  "allocation or free and unmaps emptied pages", {"page_id_bytes": page},
                  {"steps": steps})
    return rec, md


def kv_capacity(out: dict[str, Any]) -> tuple[LabRecord, str]:
    rows = out["rows"]
    stock, elastic = rows[0], rows[1]

    def fits(r: dict) -> bool:  # vLLM's blocks fill the KV bytes to within one page id/block
        if r["formula_blocks"] is None:
            return r["num_gpu_blocks"] > 0
        slack = (r["page_id_bytes"] or r["bytes_per_block"]) // r["bytes_per_block"] + 1
        return abs(r["num_gpu_blocks"] - r["formula_blocks"]) <= slack

    ok = all(fits(r) for r in rows)
    verdict = ("supported: vLLM's num_gpu_blocks is the formula's KV bytes / bytes per block" if
               ok else "refuted: vLLM's num_gpu_blocks is not KV bytes / bytes per block")
    headline = (f"stock {stock['num_gpu_blocks']} blocks (formula {stock['formula_blocks']}), "
                f"elastic {elastic['num_gpu_blocks']} (formula {elastic['formula_blocks']})")
    md = _md("KV capacity", [
        ("num_gpu_blocks = KV bytes / (2 x layers x KV heads x head dim x block x dtype)",
         headline),
        ("the elastic pool's virtual capacity covers vLLM's blocks",
         f"{elastic['kv_bytes'] / MiB:.0f} MiB for {elastic['blocks_x_bytes'] / MiB:.0f} MiB "
         f"of blocks"),
    ], rows, verdict)
    rec = _record("kv-capacity", out, "vLLM sizes its block pool by the capacity formula",
                  verdict, headline, "KV bytes (the CPU's KV space, or the elastic pool's "
                  "virtual budget) divided by one block's K and V over all layers",
                  {}, {"capacity": rows})
    return rec, md


REPORTS = {"output-equality": output_equality, "dynamic-limit": dynamic_limit,
           "kv-capacity": kv_capacity}
