"""The lab protocol: a :class:`Lab` has a name, a typed parameter dataclass, the backends it
supports and ``run(params, backend) -> LabResult``. The CLI, the chapters and the tests drive
every lab through it.

A lab refuses *before* running (and so writes no record) when the backend name is unknown, when
the lab does not support it, or when it cannot be used here (``gpu`` without a CUDA GPU): the
check asks :func:`workbench.backends.kind` and :func:`workbench.backends.require`, which build
nothing.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from workbench.errors import ConfigError
from workbench.labs.kit.params import build, check_params
from workbench.labs.kit.record import LabRecord

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

        self.markdown = tidy_tables(self.markdown)  # no Python reprs in any lab's cells

    def write(self, path: str | Path) -> list[Path]:
        """The JSON record at ``path`` and the Markdown report beside it (``.md``)."""
        return self.record.write(path, self.markdown)


class Lab(ABC):
    """Subclasses set the class attributes and implement :meth:`run`."""

    name: ClassVar[str]
    description: ClassVar[str]
    params_type: ClassVar[type]  # a dataclass; every field has a default
    backends: ClassVar[tuple[str, ...]]  # kept in the registry's order (sim, host, gpu)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "backends" in cls.__dict__:  # one order wherever a lab's backends are shown
            from workbench.backends import BACKENDS

            cls.backends = tuple(sorted(cls.backends, key=BACKENDS.index))

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
        return check_params(self.name, params)

    def _refuse_unknown(self, keys: Mapping[str, Any]) -> None:
        names = sorted(f.name for f in dataclasses.fields(self.params_type))
        unknown = sorted(set(keys) - set(names))
        if unknown:
            raise ConfigError(f"parameter {unknown[0]!r} of lab {self.name!r}", "is not one of "
                              "its parameters", f"use one of {', '.join(names)}")

    def check_backend(self, backend: str, params: Any = None) -> None:
        """Refuse (one ConfigError line) an unknown backend name, one this lab does not support,
        and one that cannot be used here (``gpu`` without a CUDA GPU); nothing has run yet.
        A lab whose needs depend on its parameters (GPUs per rank) overrides this and reads
        ``params`` (None: the defaults)."""
        from workbench.backends import kind, require

        if kind(backend) not in self.backends:
            raise ConfigError(f"lab {self.name!r} on backend {backend!r}",
                              "is not supported by this lab",
                              f"use --backend {' or '.join(self.backends)}")
        require(backend)

    @abstractmethod
    def run(self, params: Any, backend: str = "sim",
            progress: Progress | None = None) -> LabResult:
        """Run the lab; call :meth:`check_backend` first (the registry's ``run_lab`` does)."""
