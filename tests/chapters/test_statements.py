"""Statements the chapters once got wrong stay corrected, and a GPU run says what stays simulated.

Each test reads the cell (by its id) or the quiz question that held the statement, or runs the
code the cell runs and checks what it prints.
"""

from __future__ import annotations

import json
import re

import pytest

from workbench.config import PoolConfig
from workbench.core.budget_device import BudgetDevice
from workbench.core.geometry import KVGeometry
from workbench.core.ledger import KVCacheManager
from workbench.errors import ConfigError, DeviceError
from workbench.quiz import load_chapter_quiz
from workbench.quiz.seal import open_quiz
from workbench.sim.device import SimDevice
from workbench.viz.simnote import PREFIX, simulated_here, skipped_here

from .nbrun import CHAPTERS, NOTEBOOKS, ROOT

GiB, MiB = 1 << 30, 1 << 20


def cell(chapter: str, cid: str) -> str:
    nb = json.loads((CHAPTERS / f"{chapter}.ipynb").read_text())
    return "".join(next(c for c in nb["cells"] if c.get("id") == cid)["source"])


def question(qid: str):
    quiz = load_chapter_quiz(next(p.stem for p in NOTEBOOKS if p.stem.startswith(qid[:2])))
    return next(q for q in quiz.questions if q.id == qid)


def quiz_text(chapter: str) -> str:
    sealed = json.loads((ROOT / "workbench" / "quiz" / "data" / f"{chapter}.json").read_text())
    return json.dumps(open_quiz(sealed), ensure_ascii=False)  # the key as its author wrote it


# -- item: ch10 sent the reader to chapter 7 for elastic KV's faults; they are in 06
@pytest.mark.parametrize("cid", ["c01", "c14"])
def test_ch10_points_at_chapter_06_for_elastic_faults(cid):
    text = cell("10_beyond_hbm", cid)
    assert "chapter 7" not in text
    assert "[chapter 06](06_tp_pp_transactions.ipynb)" in text


# -- item: ch00 said nothing else changes on gpu --------------------------------------------------
def test_ch00_says_exactly_what_gpu_changes():
    text = cell("00_start_here", "c02")
    assert "Nothing else in a chapter changes" not in text
    for name in ("tp_transaction", "run_point", "engine_core_split", "device_gib",
                 "BudgetDevice", "SGLang-like serving engine", f"`{PREFIX}`"):
        assert name in text, name


# -- item: the .pth reason did not match vLLM's fork default
def test_ch07_gives_the_pth_reasons_that_hold():
    text = cell("07_operating", "ch07-06")
    assert "separately started engine-core process" not in text
    assert "`VLLM_WORKER_MULTIPROC_METHOD=spawn`" in text and "default is `fork`" in text
    assert "No script of yours runs" in text and "spawned child starts a fresh" in text
    summary = cell("07_operating", "ch07-34")
    assert "so every process of the engine runs them" not in summary
    assert "forked one (vLLM's default) inherits the hook" in summary


def test_quiz_07_why_pth_is_true_of_fork_and_spawn():
    q = question("07-why-pth")
    right = next(c for c in q.choices if c.correct)
    assert "spawned child" in right.text and "no user script" in right.text
    assert "start their own interpreters" not in quiz_text("07_operating")
    assert "forks by default" in right.feedback and "upstream-vllm-mp-method" in right.feedback


# -- item: "EngineCore holds no KV at all", and self-test Q7 asked before ch05 taught it
def test_both_sides_question_is_in_chapter_05_and_true_at_tp1():
    for chapter in ("02_elastic_memory", "05_one_request"):
        assert "EngineCore holds no KV at all" not in quiz_text(chapter)
    in02 = [q.prompt for q in load_chapter_quiz("02_elastic_memory").questions]
    assert not any("patched on both" in p for p in in02)
    q = question("05-both-sides")
    assert "patched on both" in q.prompt
    wrong_copy = next(c for c in q.choices if "full copy" in c.text)
    assert "TP = 1 with the uniprocess executor" in wrong_copy.feedback
    assert "upstream-vllm-uniproc" in wrong_copy.feedback


# -- item: ch05's chain omitted KVCacheCoordinator; two KVCacheManagers
def test_ch05_chain_names_the_coordinator_and_which_kvcachemanager():
    from workbench.backends import make_device
    from workbench.viz.lifecycle import build_engine, roles

    assert "roles(vllm)" in cell("05_one_request", "c506")  # the cell prints these lines
    lines = dict(roles(build_engine("vllm", make_device("sim"))))
    assert "KVCacheCoordinator" in lines["VLLMKVManager"]
    assert lines["VLLMKVManager"].startswith("vLLM KVCacheManager")
    assert "block ledger" in lines["KVCacheManager"] and "kvcached" in lines["KVCacheManager"]
    sglang = dict(roles(build_engine("sglang", make_device("sim"))))
    assert "RadixCache" in sglang and "block ledger" in sglang["KVCacheManager"]
    text = cell("05_one_request", "c502")
    assert "vLLM's `KVCacheManager` → `KVCacheCoordinator` → `BlockPool`" in text
    assert "sits **above** its block pool" in text and "sits **below** it" in text
    assert "#upstream-vllm-kv-chain" in text


# -- item: ch01 quoted 74 vs 3,348 µs without its configuration ------------------------------------
def test_ch01_names_the_configuration_of_its_h200_figures():
    gpu_md = (ROOT / "docs" / "gpu.md").read_text()

    def grow_us(layout: str, zero: str) -> float:
        m = re.search(rf"\| {layout} \(\d+\) \| workbench, zero page {zero}[^|]*\| ([\d.]+) \|",
                      gpu_md)
        assert m, (layout, zero)
        return float(m.group(1))

    text = cell("01_block_token_page", "c07c")
    assert "zero page\n**off**" in text or "zero page **off**" in text
    for layout, zero, shown in (("contiguous", "off", "0.074 ms"), ("per-layer", "off", "3.35 ms"),
                                ("contiguous", "on", "0.090 ms"), ("per-layer", "on", "4.53 ms")):
        assert abs(grow_us(layout, zero) / 1000 - float(shown.split()[0])) < 0.006, shown
        assert shown in text.replace("against ", "")
    assert "74 µs" not in text and "3,348 µs" not in text


# -- item: ch06 said kvcached 0.1.6 synchronizes every vLLM worker
def test_ch06_says_where_kvcached_synchronizes_and_how_it_knows():
    text = cell("06_tp_pp_transactions", "c602")
    assert "kvcached 0.1.6 runs `torch.cuda.synchronize()` on every vLLM worker" not in text
    assert "#upstream-kvcached-sync" in text and "#research-" not in text  # public code only
    assert "`csrc/page_allocator.cpp`" in text and "`_worker_physical_release_barrier`" in text


# -- an honest GPU switch ---------------------------------------------------------------------
def test_simulated_here_speaks_only_off_the_simulator(capsys):
    assert simulated_here("sim", "x") is None and skipped_here("sim", "x", "y") is None
    assert capsys.readouterr().out == ""
    note = simulated_here("gpu", "tp_transaction")
    assert note.startswith(PREFIX) and "backend='gpu'" in note
    assert skipped_here("gpu", "the SGLang-like engine", "sim only").startswith("[skipped on gpu]")
    assert capsys.readouterr().out.count("\n") == 2


SIM_ONLY = ("tp_transaction(", "run_point(", "engine_core_split(", "run_cluster(",
            "crossover_rows(", "run_pd(", "faults_store", 'run_lab("idle-footprint"',
            'run_lab("colocation", get_lab("colocation").params(peaks=(min')


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_simulated_cell_says_so_on_gpu(path):
    nb = json.loads(path.read_text())
    for c in nb["cells"]:
        src = "".join(c["source"])
        if c["cell_type"] == "code" and any(s in src for s in SIM_ONLY):
            assert "simulated_here(backend," in src, f"{path.stem} {c['id']}: silent on gpu"
    if path.stem == "05_one_request":
        assert "skipped_here(backend, \"the SGLang-like serving engine\"" in cell(path.stem, "c518")


def test_budget_device_refuses_past_its_budget():
    dev = BudgetDevice(SimDevice(capacity=8 * GiB), 4 * 2 * MiB)
    handles = [dev.create(2 * MiB) for _ in range(4)]
    assert dev.mem_info() == (0, 8 * MiB)
    with pytest.raises(DeviceError, match="budget the pools share"):
        dev.create(2 * MiB)
    dev.release(handles.pop())
    assert dev.mem_info().free == 2 * MiB and dev.create(2 * MiB)
    with pytest.raises(ConfigError, match="granularity"):
        BudgetDevice(SimDevice(), 3 * MiB)


def test_a_pool_on_a_budget_misses_like_one_on_a_device_that_size():
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, num_blocks=64 * 8)
    cfg = PoolConfig(prealloc=False, min_reserved_pages=0, max_reserved_pages=0)
    small = KVCacheManager(geo, SimDevice(capacity=48 * MiB), name="s", config=cfg)
    budget = KVCacheManager(geo, BudgetDevice(SimDevice(capacity=8 * GiB), 48 * MiB),
                            name="b", config=cfg)
    got = [(small.alloc(64) is None, budget.alloc(64) is None) for _ in range(8)]
    assert [s for s, _ in got] == [b for _, b in got] and any(s for s, _ in got)


def test_ch04_colocation_contends_on_a_gpu_budget(monkeypatch):
    """Stand a big simulated GPU in for a real one (capacity dropped, as the gpu backend drops
    it): the three pools contend exactly as on the 1 GiB simulated device."""
    import workbench.viz.scenarios as sc

    on_sim = sc.colocation(steps=24, device_gib=0.8, backend="sim")
    from workbench.backends import capabilities

    monkeypatch.setattr(sc, "capabilities", lambda name: capabilities("gpu"))
    monkeypatch.setattr(sc, "make_device", lambda name, **kw: SimDevice(capacity=64 * GiB))
    on_gpu = sc.colocation(steps=24, device_gib=0.8, backend="gpu")
    assert sum(on_sim.misses.values()) > 0
    assert on_gpu.misses == on_sim.misses and on_gpu.finished == on_sim.finished
    assert "budget 0.80 GiB" in on_gpu.rec.managers["a"].device.name


# -- polish seen in the browser
def test_ch00_experiment_table_is_one_table():
    text = cell("00_start_here", "c07")
    start = text.index("| handbook (")
    table = text[start:text.index("\n\n", start)]
    rows = table.splitlines()  # header, rule, 12 rows: no blank line breaks it in two
    assert len(rows) == 14 and all(r.startswith("| ") or r.startswith("|---") for r in rows)
    assert "#seed-003-e5)–[E9]" in table.splitlines()[-1]


def test_ch06_cases_are_an_html_table_with_every_outcome_in_full():
    from workbench.viz.transactions import CaseResult, case_html

    long = "abort sent to every target; " * 6 + "<the end>"
    r = CaseResult(name="prepare lost", fault="drop_reply", outcome=long, page="reclaimed",
                   failed=None, messages=[], participants=[], workers={}, disagree=[])
    out = case_html([r])
    assert out.startswith("<table") and "&lt;the end&gt;" in out and "..." not in out
    assert "case_html(results)" in cell("06_tp_pp_transactions", "c610")


def test_message_times_read_in_ms_not_seven_digit_us():
    from workbench.viz.sequence import _when

    assert _when(2e-5) == "20 µs" and _when(1.2345678) == "1,234.6 ms"


def test_kvtop_legend_explains_the_bar_glyphs():
    from workbench.cli.kvtop import legend

    text = legend().plain
    assert "░ not mapped" in text and "█ used" in text and "▓ reserved" in text


@pytest.mark.parametrize("qid, other", [("09-page-size-bytes", "01-vllm-page"),
                                        ("09-group-hash", "03-group-hash")])
def test_chapter_09_does_not_repeat_an_earlier_question(qid, other):
    q, earlier = question(qid), question(other)
    assert q.prompt != earlier.prompt and q.kind != earlier.kind or \
        {c.text for c in q.choices}.isdisjoint({c.text for c in earlier.choices})
    assert "Chapter 0" in q.explanation  # says how it differs from the earlier one


# -- the mechanism in view: cells built from the core's own calls
def run_cell(chapter: str, cid: str, capsys) -> str:
    src = cell(chapter, cid)
    exec(compile(src, f"{chapter}:{cid}", "exec"), {"backend": "sim"})
    return capsys.readouterr().out


def test_ch02_builds_the_page_state_machine_call_by_call(capsys):
    src = cell("02_elastic_memory", "c03b")
    assert "KVCacheManager(geo, make_device(backend)" in src and "explore" not in src
    out = run_cell("02_elastic_memory", "c03b", capsys).splitlines()
    assert out[0].startswith("reserved 48.00 MiB of virtual space")  # before any page is backed
    assert "2:reserved" in out[4] and "1:in_use" in out[4]  # parked: the reserve has room
    assert "1:free" in out[5] and "mapped 16.00 MiB" in out[5]  # unmapped: the reserve is full
    assert "page 1 mapped: False" in out[6]
    before, after = out[6].split("the unmap: ")[1].split()
    assert before == after  # the tensor's address survives the unmap (self-test Q4)
    assert "2:in_use" in out[7] and "mapped 16.00 MiB" in out[7]  # the parked page reused


def test_ch03_builds_insert_match_lock_evict_by_hand(capsys):
    src = cell("03_prefix_ownership", "c06b")
    for call in ("rc.insert(", "rc.match_prefix(", "rc.inc_lock_ref(", "rc.evict(",
                 "rc.dec_lock_ref("):
        assert call in src, call
    out = run_cell("03_prefix_ownership", "c06b", capsys)
    assert "B matches 8 tokens" in out and "evictable 4 tokens, locked 8" in out
    assert "frees 4 tokens (A's own suffix only); B's prefix still cached: True" in out
    assert "B done: evict(100) frees 8 tokens; tree 0 tokens, ledger blocks held 0" in out


def test_ch06_builds_prepare_abort_commit_by_hand(capsys):
    src = cell("06_tp_pp_transactions", "c604b")
    for call in ("space.prepare_unmap(3)", "space.abort_unmap(3)", "space.commit_unmap(3)"):
        assert call in src, call
    out = run_cell("06_tp_pp_transactions", "c604b", capsys).splitlines()
    assert "mapped False handles kept 1  physical 8 MiB" in out[1]  # prepare: handle kept
    assert "mapped True  handles kept 0  physical 8 MiB" in out[2]  # abort: put back
    assert "mapped False handles kept 0  physical 0 MiB" in out[3]  # commit: released
    assert out[4].endswith("physical 0 MiB")  # a repeated commit changes nothing


def test_ch05_walks_one_request_down_the_chain_by_hand(capsys):
    src = cell("05_one_request", "c506b")
    for call in ("BlockPool(ledger)", "VLLMKVManager(pool)", "kvm.get_computed_blocks(",
                 "kvm.allocate_slots(", "kvm.free(a)"):
        assert call in src, call
    out = run_cell("05_one_request", "c506b", capsys).splitlines()
    assert "page map 0:in_use 1:free" in out[0]
    assert "A: 0 hit" in out[1] and "on VMM pages [0, 1]" in out[1] and "1:in_use" in out[1]
    assert "10 blocks cached" in out[2] and "1:in_use" in out[2]  # cached: still mapped
    assert "B: 8 hit, allocate_slots(32)" in out[3] and "[1, 2, 3, 4, 5, 6, 7, 8, 11, 12]" in out[3]


def test_ch05_runs_vllm_preemption_against_sglang_retract(capsys):
    src = cell("05_one_request", "c519b")
    assert "VLLMScheduler(" in src and "SGLangScheduler(" in src
    out = run_cell("05_one_request", "c519b", capsys)
    assert "vllm, step" in out and "preempts request" in out
    assert "vllm: 1 gave way" in out
    assert "sglang (defaults): 0 gave way" in out
    assert "sglang (optimistic admission), step" in out and "retracts request" in out
    assert out.count("3 of 3 finished") == 3
