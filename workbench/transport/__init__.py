"""Real TP/PP workers: OS processes over Unix sockets (length-prefixed JSON, never pickle).

``WorkerGroup`` starts a pool's workers, ``SocketTransport`` carries the coordinator's messages,
``gc_sockets()`` removes socket directories whose owner died (``workbench kvctl gc``).
"""

from __future__ import annotations

from workbench.transport.client import SocketTransport, WorkerGroup
from workbench.transport.paths import base_dir, gc_sockets

__all__ = ["SocketTransport", "WorkerGroup", "base_dir", "gc_sockets"]
