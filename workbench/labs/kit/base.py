"""The lab protocol: a :class:`Lab` has a name, a typed parameter dataclass and, as data, the
runner that serves each engine family it runs (``runners``), the capabilities a runner needs
(``needs``), and -- in its ``engine`` parameter's declared range -- the engine kinds it runs.
The CLI, the chapters and the tests drive every lab through it.

The kit does the rest: :meth:`Lab.check_backend` resolves the run once
(:func:`workbench.labs.kit.resolve.resolve`: backend capabilities and engine kinds into one
:class:`~workbench.labs.kit.resolve.LabRun`), refusing before anything runs (so no record is
written); :meth:`Lab.run` hands that run to the family's runner, ``runner(params, run,
progress) -> LabResult``. The backends a lab lists follow from the same data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from workbench.citations import link_seed_refs, rebase
from workbench.errors import ConfigError
from workbench.labs.kit.params import build, check_params, specs
from workbench.labs.kit.record import LabRecord
from workbench.labs.kit.resolve import EngineChoices, LabRun, backends_of, resolve

Progress = Callable[[int, int, str], None]  # progress(done, total, what)


@dataclass(slots=True)
class LabResult:
    """One run: the record (seed 003 §12 + manifest), its tables, its figures, its Markdown."""

    record: LabRecord
    markdown: str
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)  # plotly figures; {} without plotly

    def __post_init__(self) -> None:
        from workbench.labs.kit.report import tidy_tables

        # every lab's report passes here: no Python reprs in its cells, its seed references
        # linked into docs/sources.md
        self.markdown = link_seed_refs(tidy_tables(self.markdown))

    def write(self, path: str | Path) -> list[Path]:
        """The JSON record at ``path`` and the Markdown report beside it (``.md``), its links
        pointing at docs/sources.md from there."""
        return self.record.write(path, rebase(self.markdown, Path(path).parent))


Runner = Callable[[Any, LabRun, "Progress | None"], LabResult]


class Lab:
    """Subclasses set the class attributes; the kit resolves, refuses and dispatches."""

    name: ClassVar[str]
    description: ClassVar[str]
    params_type: ClassVar[type]  # a dataclass; every field has a default
    runners: ClassVar[Mapping[str, Runner]]  # engine family -> the runner that serves it
    needs: ClassVar[Mapping[str, Mapping[str, Any]]] = {}  # family -> Capabilities it needs
    ranks: ClassVar[Callable[[Any], int] | None] = None  # ranks of one GPU each (TP/PP labs)
    reads_back: ClassVar[str | None] = None  # a parameter that, set, reads saved runs back

    @property
    def backends(self) -> tuple[str, ...]:
        """The backends some run of this lab fits (the backend registry's order)."""
        return backends_of(self.runners, self.engine_choices(), self.needs)

    @property
    def engines(self) -> tuple[str, ...]:
        """The engine kinds this lab's engine parameter may name (its declared range)."""
        choices = self.engine_choices()
        return choices.expand() if choices is not None else ()

    def engine_choices(self) -> EngineChoices | None:
        """The engine parameter's declared range (``RANGES["engine"]``, optional or not);
        None for a lab without one."""
        spec = specs(self.params_type).get("engine")
        spec = getattr(spec, "spec", spec)  # inside Opt: None picks the backend's default
        return spec if isinstance(spec, EngineChoices) else None

    def params(self, **values: Any) -> Any:
        """The parameter dataclass from typed values, each checked against its declared range
        (:mod:`workbench.labs.kit.params`); unknown keys refused."""
        self._refuse_unknown(values)
        return build(self.name, self.params_type, values)

    def parse_params(self, text: Mapping[str, str]) -> Any:
        """The parameter dataclass from ``key -> text`` pairs (``--param key=value``), each
        parsed and checked by its declared range."""
        self._refuse_unknown(text)
        return build(self.name, self.params_type, text)

    def check_params(self, params: Any) -> Any:
        """``params`` with every field checked against its declared range (``run_lab``)."""
        return check_params(self.name, self.params_type, params)

    def _refuse_unknown(self, keys: Mapping[str, Any]) -> None:
        names = sorted(f.name for f in dataclasses.fields(self.params_type))
        unknown = sorted(set(keys) - set(names))
        if unknown:
            raise ConfigError(f"parameter {unknown[0]!r} of lab {self.name!r}", "is not one of "
                              "its parameters", f"use one of {', '.join(names)}")

    def check_backend(self, backend: str, params: Any = None) -> LabRun:
        """The run resolved (:func:`~workbench.labs.kit.resolve.resolve`), or one ConfigError
        line; nothing has run yet. ``params`` None: the defaults."""
        return resolve(self, params, backend)

    def check_run(self, params: Any, run: LabRun) -> None:
        """A lab's own rule between its parameters and the resolved run (one ConfigError
        line); none by default."""

    def run(self, params: Any, backend: str = "sim",
            progress: Progress | None = None) -> LabResult:
        """Resolve the run, then hand it to the runner of its engine family."""
        run = self.check_backend(backend, params)
        return self.runners[run.family](params, run, progress)
