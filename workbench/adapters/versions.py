"""Version ranges for patches: ``">=0.5.23,<0.5.24"``. Local tags and post/dev/rc parts are
ignored (``0.32.0+cpu`` is 0.32.0), so a range says which *releases* a patch was written for."""

from __future__ import annotations

import re
from importlib import metadata

from workbench.errors import ConfigError

_RELEASE = re.compile(r"^\s*v?(\d+(?:\.\d+)*)")
_CLAUSE = re.compile(r"^(>=|<=|==|!=|>|<)\s*(\S+)$")


def release(version: str) -> tuple[int, ...]:
    m = _RELEASE.match(version)
    if not m:
        raise ConfigError(f"version {version!r}", "it does not start with a release number",
                          "write a version like 0.5.23")
    parts = [int(p) for p in m.group(1).split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


class VersionRange:
    def __init__(self, spec: str):
        self.spec = spec
        self.clauses: list[tuple[str, tuple[int, ...]]] = []
        for raw in filter(None, (c.strip() for c in spec.split(","))):
            m = _CLAUSE.match(raw)
            if not m:
                raise ConfigError(f"version clause {raw!r} in {spec!r}",
                                  "a clause is one of >=, <=, ==, !=, >, < and a version",
                                  "write a range like '>=0.5.23,<0.5.24'")
            self.clauses.append((m.group(1), release(m.group(2))))

    def __contains__(self, version: str) -> bool:
        v = release(version)
        ops = {">=": v.__ge__, "<=": v.__le__, "==": v.__eq__, "!=": v.__ne__,
               ">": v.__gt__, "<": v.__lt__}
        return all(ops[op](ref) for op, ref in self.clauses)

    def __repr__(self) -> str:
        return f"VersionRange({self.spec!r})"

    def __str__(self) -> str:
        return self.spec


def dist_version(*dists: str) -> tuple[str, str] | None:
    """(distribution, version) of the first installed distribution, without importing it."""
    for d in dists:
        try:
            return d, metadata.version(d)
        except metadata.PackageNotFoundError:
            continue
    return None
