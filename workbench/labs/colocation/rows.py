"""What the colocation lab's runners hand back (:class:`ColocationRun`) and the helpers
its runners and report share: the two modes, the spread over repeats, reading records back."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from workbench.engines.metrics import SLO
from workbench.errors import ConfigError, WorkbenchError

MODES = ("static", "elastic")


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
