"""The output-equality lab's tables, checks, record, Markdown and figure."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.labs.kit.record import LabRecord, Manifest
from workbench.labs.kit.server_report import kind_of, real_markdown, real_record

if TYPE_CHECKING:
    from workbench.labs.output_equality.params import OutputEqualityParams

NEAR_TIE = 1 / 64  # a few bf16 steps (2^-8 each): a gap this small may flip with rounding
# what the seed predicts for each deliberately wrong layout: (tokens equal?, canary flags?)
EXPECTED_CANARY = {"none": (True, False), "v-aliases-k": (False, True),
                   "layers-alias": (False, True), "block-stride-half": (False, True),
                   "layers-permuted": (True, True)}


# what this report says of a kind (a kind not listed: vLLM's words); counted: preemptions in
# the engine's own metrics (SGLang's retractions are in its log only)
WORDS = {"vllm": {"name": "vLLM", "counted": True, "invariance":
                  "vLLM's batch-invariant mode on every engine (VLLM_BATCH_INVARIANT=1)"},
         "sglang": {"name": "SGLang", "counted": False, "invariance":
                    "SGLang's deterministic mode on every engine "
                    "(--enable-deterministic-inference)"}}

def _expected(layout: str) -> str:
    same, flags = EXPECTED_CANARY[layout]
    return f"tokens {'equal' if same else 'differ'}, canary {'flags' if flags else 'silent'}"


def tables(out: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    canary = [{"seed": c["seed"], "layout": c["layout"], "tokens_equal": c["equal"],
               "prompts_differing": c["prompts_differing"],
               "first_difference": c["first_difference"],
               "canary_wrong": c["canary_wrong"], "canary_checked": c["canary_checked"],
               "flagged": c["canary_wrong"] > 0,
               "expected": _expected(c["layout"])}
              for c in out["canaries"]]
    return {"equality": out["rows"], "canary": canary}


def checks(out: dict[str, Any], tabs: dict[str, list]) -> dict[str, bool]:
    eq = tabs["equality"]
    dense = [r for r in eq if r["case"] == "paged vs dense"]
    return {
        "static and elastic tokens identical": all(r["equal"] for r in eq
                                                    if r["case"] != "paged vs dense"),
        "pages were recycled": all(r["unmaps"] > 0 for r in eq
                                   if r["case"] == "elastic, pages recycled"),
        "pressure preempted": all(r["preemptions"] > 0 for r in eq
                                  if r["case"] == "elastic, under pressure"),
        "paged vs dense: equal or a near tie": all(g <= NEAR_TIE for r in dense
                                                   for g in r["near_tie_gaps"]),
        "canary as expected": all((c["tokens_equal"], c["flagged"]) ==
                                  EXPECTED_CANARY[c["layout"]] for c in tabs["canary"]),
        "canary silent on elastic memory": out["elastic_canary"]["wrong"] == 0
        and out["elastic_canary"]["checked"] > 0,
    }


def _verdict(out: dict[str, Any], tabs: dict[str, list]) -> str:
    bad = [k for k, ok in checks(out, tabs).items() if not ok]
    if bad:
        return "Refuted: " + ", ".join(bad)
    n = sum(1 for r in tabs["equality"] if r["case"] != "paged vs dense")
    return (f"Supported on {out['backend']}: static and elastic KV gave identical greedy tokens "
            f"in {n}/{n} comparisons; the canary flagged every wrong layout, including the one "
            "whose tokens stayed identical")


def markdown(out: dict[str, Any], tabs: dict[str, list], p: OutputEqualityParams) -> str:
    m = out["model"]
    lines = ["# Output equality: static vs elastic KV, and a layout canary", "",
             f"The mini engine on {out['device']}: model `{p.model}` ({m['layers']} layers) with "
             f"{m['kv_heads']} KV heads of {m['head_dim']}, bf16, random weights seeded by "
             f"the model config; {out['prompts']} prompts per seed, {out['max_tokens']} greedy "
             f"tokens each; seeds {out['seeds']}, the case order reversed on odd seeds.", "",
             "**Expected (seed 000 §13)**: a normal memory curve does not prove the KV "
             "addresses right. With the same model, prompts, seed and sampling, elastic KV must "
             "give the static run's tokens; differences are allowed only where the backend or "
             "dtype explains them, never garbage, repeats or drift with context. A wrong stride "
             "or offset must be caught.", "",
             "## Equality (each case against its own reference; one factor changed)", "",
             "| case | factor | seed | identical | prompts differing | first difference | "
             "preemptions | pages unmapped |", "|---|---|---|---|---|---|---|---|"]
    for r in tabs["equality"]:
        extra = (f" (top-2 gap {', '.join(f'{g:.2%}' for g in r['near_tie_gaps'])})"
                 if r.get("near_tie_gaps") else "")
        lines.append(f"| {r['case']} | {r['factor']} | {r['seed']} | {r['equal']} | "
                     f"{r['prompts_differing']} | {r['first_difference']}{extra} | "
                     f"{r['preemptions']} | {r['unmaps']} |")
    lines += ["", "## Canary (wrong views on static memory)", "",
              "| layout | seed | tokens equal | first difference | canary: blocks wrong / "
              "checked | expected |", "|---|---|---|---|---|---|"]
    for c in tabs["canary"]:
        lines.append(f"| {c['layout']} | {c['seed']} | {c['tokens_equal']} | "
                     f"{c['first_difference']} | {c['canary_wrong']} / {c['canary_checked']} | "
                     f"{c['expected']} |")
    ec = out["elastic_canary"]
    lines += ["", f"The canary on an elastic pool's own views: {ec['wrong']} / {ec['checked']} "
              "wrong.", "", "## Checks", ""]
    lines += [f"* {k}: {'yes' if ok else 'NO'}" for k, ok in checks(out, tabs).items()]
    lines += ["", f"**Verdict**: {_verdict(out, tabs)}.", "", NOTES]
    return "\n".join(lines) + "\n"


NOTES = f"""## Reading the differences

* **Paged vs dense** is not a memory comparison: dense attention recomputes the whole sequence
  each step, so its bf16 sums run in another order. Where it differs, the dense model's two best
  logits were within {NEAR_TIE:.1%} of each other (the top-2 gap in the table): a near tie that
  rounding decides, the dtype behaviour the seed allows. Static and elastic KV store the same
  bf16 bytes and run the same kernels, so between them nothing but identity is acceptable.
* **layers-permuted** is the lesson of §13.3: every layer reads what it wrote, so the tokens are
  identical, yet the bytes are not where the geometry says; anything else that reads them by the
  geometry (another engine, a transfer, a debugger) gets another layer's K/V. Only a layout
  canary sees it.
* The wrong views run on *static* memory, where every wrong address is still backed and reads
  stale bytes: the silent case. On elastic memory a wrong address may instead land on an
  unmapped page and fault, which would end the run; this lab does not try it. The canary itself
  needs only views and the geometry, so it runs on either (the elastic row above).
* A first difference at position 0 means the first token, computed from the prompt, already
  read K/V back from the wrong place."""


def record(out: dict[str, Any], tabs: dict[str, list], p: OutputEqualityParams,
           backend: str) -> LabRecord:
    return LabRecord(
        experiment_id="output-equality", hypothesis="elastic KV changes where the bytes live, "
        "not what the model computes: identical greedy tokens; a layout canary catches a wrong "
        "view that tokens alone may not",
        environment={"backend": backend, "device": out["device"]},
        model_io={"model": out["model"], "prompts": out["prompts"],
                  "max_tokens": out["max_tokens"], "sampling": "greedy"},
        cache_state="no prefix cache", load={"batch": "all prompts at once (waves: 2 halves)"},
        samples={"seeds": out["seeds"], "order": "cases reversed on odd seeds"},
        outcomes={"comparisons": len(tabs["equality"]), "canaries": len(tabs["canary"])},
        ttft={}, tpot_itl={}, e2e={}, throughput={}, slo_goodput={}, hits={},
        transfer_bytes=None, phase_times=None,
        kv={"pool_bytes": out["pool_bytes"], "elastic_canary": out["elastic_canary"]},
        correctness=_verdict(out, tabs), raw_data={}, verdict=_verdict(out, tabs),
        mechanism="both memories sit under the same views built from one geometry; only a "
                  "wrong view (offset or stride) changes what attention reads",
        open_questions=["vLLM/SGLang on CPU with elastic KV (the engine environment) are not "
                        "compared here; the mini engine stands in"],
        applicability="bf16 greedy decoding, block and token-slot layouts",
        manifest=Manifest.collect(
            hardware={"device": out["device"]},
            engine_config={"engine": "workbench mini", "model": out["model"], "dtype": "bf16"},
            kvcached_config={"page_size": "2 MiB", "pool_bytes": out["pool_bytes"]},
            backend=backend),
        results=tabs)


def figures(tabs: dict[str, list]) -> dict[str, Any]:
    """Canary: wrong blocks per layout, and prompts whose tokens differ; {} without plotly."""
    try:
        import plotly.graph_objects as go
    except ImportError:
        return {}
    rows = [c for c in tabs["canary"] if c["seed"] == tabs["canary"][0]["seed"]]
    fig = go.Figure()
    fig.add_bar(x=[c["layout"] for c in rows], y=[c["canary_wrong"] for c in rows],
                name="canary: blocks wrong")
    fig.add_bar(x=[c["layout"] for c in rows], y=[c["prompts_differing"] for c in rows],
                name="prompts with different tokens")
    fig.update_layout(barmode="group", yaxis_title="count",
                      title="What each check sees of a deliberately wrong layout")
    return {"canary": fig}


def _invariance(out: dict[str, Any]) -> str:
    if not out.get("batch_invariant"):
        return "not forced (the CPU's sums do not depend on it)"
    return WORDS.get(kind_of(out), WORDS["vllm"])["invariance"]


def _small(out: dict[str, Any], pre: tuple) -> str:
    counted = WORDS.get(kind_of(out), WORDS["vllm"])["counted"]
    unit = "blocks" if counted else "token slots"
    stock = out.get("small_stock_blocks")  # older records gave stock the elastic pool's size
    pool = (f"small pool (elastic {out['small_blocks']} {unit} under a {out['limit']} limit, "
            f"stock given the limit's {stock})" if stock is not None else
            f"small pool ({out['small_blocks']} {unit}, limit {out['limit']})")
    if not counted:  # no metrics endpoint
        return f"{pool}: SGLang retracts and recomputes (counted in its log, not here)"
    return f"{pool}: preemptions stock {pre[0]}, elastic {pre[1]}"


def vllm_report(out: dict[str, Any]) -> tuple[LabRecord, str]:
    """The record and Markdown of a run on a real vLLM or SGLang (:mod:`.server`'s rows)."""
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
    md = real_markdown("Output equality", [
        ("greedy tokens equal, elastic vs stock", f"{headline} over {len(rows)} cases"),
        ("prefix caching changes nothing", next((f"{r['equal']}/{r['prompts']}" + (
            f" ({r['cached_tokens']} prompt tokens from the cache)" if "cached_tokens" in r
            else "") for r in rows if "prefix" in r["case"]), "-")),
        ("seeded sampling reproducible", next((f"{r['equal']}/{r['prompts']}" for r in rows
                                              if "seeded" in r["case"]), "-")),
        ("stock reproduces itself (a second stock engine, the same waves)",
         ", ".join(f"{r['case']}: {r['stock_vs_stock']}/{r['prompts']}" for r in noise)
         or "not run"),
        ("which requests share a step changes no sum", _invariance(out)),
        ("a preempted and recomputed request gives the same tokens", _small(out, pre)),
    ], rows, verdict, kind_of(out))
    name = WORDS.get(kind_of(out), WORDS["vllm"])["name"]
    rec = real_record("output-equality", out, "elastic KV changes where the bytes live, not what "
                  f"{name} computes", verdict, headline, f"both engines run {name}'s own kernels "
                  "on views of the same shape; only the memory under them differs",
                  {"engines": out["engines"]}, {"equality": rows})
    return rec, md
