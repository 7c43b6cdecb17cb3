"""One engine's plans by version: each row a version range and the module whose ``build_plan``
was written for it. The installed version picks the row before anything of the engine is
imported; a version no row covers gets a plan that refuses in one line and patches nothing."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from workbench.adapters import versions
from workbench.adapters.registry import EnginePlan


@dataclass(frozen=True)
class PlanRow:
    versions: str  # the plan module's RANGE
    module: ModuleType  # has build_plan() -> EnginePlan
    tested: str  # the release it was written and tested for, as pip names it


@dataclass(frozen=True)
class PlanTable:
    engine: str
    package: str
    dists: tuple[str, ...]
    rows: tuple[PlanRow, ...]

    def row_for(self, version: str | None) -> PlanRow | None:
        if version is None:
            return None
        return next((r for r in self.rows if version in versions.VersionRange(r.versions)), None)

    def installed(self) -> str | None:
        found = versions.dist_version(*self.dists)
        return found[1] if found else None

    def build(self, version: str | None = None) -> EnginePlan:
        """The plan for ``version`` (default: the installed one)."""
        version = version or self.installed()
        row = self.row_for(version)
        if row is not None:
            return row.module.build_plan()
        tested = " or ".join(r.tested for r in self.rows)
        why = (f"cannot tell the installed {self.engine} version" if version is None else
               f"no plan for {self.engine} {version} (plans: "
               + " | ".join(r.versions for r in self.rows) + ")")
        return EnginePlan(self.engine, self.package, self.dists, [], refusal=(
            why, f"install {tested} (the versions the plans were written and tested for)"))
