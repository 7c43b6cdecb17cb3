"""Lab runners: each lab runs an experiment and returns a :class:`~workbench.labs.record.LabRecord`.

Register a lab in :data:`LABS` (name -> module path with ``run(**kw) -> LabRecord`` and
``DESCRIPTION``); ``workbench labs list|run`` reads it.
"""

from __future__ import annotations

LABS: dict[str, str] = {
    "colocation": "workbench.labs.colocation",
    "idle-footprint": "workbench.labs.idle_footprint",
}
