"""Chapter 10 (beyond HBM): the numbers its prose and quiz state are the models' own, and its
first device cell builds the device through the one backend switch."""

from __future__ import annotations

import pytest

from workbench.engines.models import get_model
from workbench.engines.sim.steptime import StepTimeModel
from workbench.pd.crossover import break_even_Bps
from workbench.pd.link import LinkSpec, handover_tokens, kv_bytes
from workbench.quiz import load_chapter_quiz

nbformat = pytest.importorskip("nbformat", reason="no notebook stack here (make setup)")
from .nbrun import CHAPTERS  # noqa: E402 - nbrun needs the notebook stack

PATH = CHAPTERS / "10_beyond_hbm.ipynb"
ST = StepTimeModel.preset("llama-3.1-8b", "a100")


def _text() -> str:
    nb = nbformat.read(PATH, as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def test_quiz_break_even_answer_is_the_models():
    quiz = load_chapter_quiz("10_beyond_hbm")
    assert len(quiz) >= 6
    q = quiz.question("10-break-even")
    assert abs(break_even_Bps(ST) / 1e9 - q.answer) <= q.tolerance


def test_prose_numbers_follow_the_models():
    text = _text()
    per_token_us = 2 * ST.model.active_params / (ST.gpu.peak_flops * ST.flops_eff) * 1e6
    assert round(per_token_us) == 86 and "about 86 µs per token" in text
    kvb = get_model("llama-3.1-8b").kv_bytes_per_token
    assert round(kvb / 20e9 * 1e6, 1) == 6.6 and "6.6 µs per token from host memory" in text
    assert round(kvb / 5e9 * 1e6) == 26 and "26 µs from the remote store" in text
    assert round(break_even_Bps(ST) / 1e9, 1) == 1.5 and "about 1.5 GB/s" in text
    assert handover_tokens(4096) == 4095 and "4095 × 131,072 bytes" in text
    assert kv_bytes(get_model("llama-3.1-8b"), 4095) == 4095 * 131_072
    # exercise 4's answer: 8 time out at 0.2 s, then 4 waves of 2 recomputes of 0.1 s
    from workbench.pd.faults_store import store_slow

    assert store_slow().state["recovery_s"] == pytest.approx(0.6)
    assert LinkSpec(2.5e9, 0.0).transfer_s(4095 * kvb) == pytest.approx(4095 * kvb / 2.5e9)


def test_first_backend_cell_builds_the_device():
    nb = nbformat.read(PATH, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    start = next(i for i, c in enumerate(code) if "parameters" in c.metadata.get("tags", []))
    first = next(c for c in code[start + 1:] if "backend" in c.source)
    assert "make_device(backend)" in first.source
