"""Socket directories: one private (0700) directory per pool under a per-user base, with PP
namespaces (``w<rank>.sock`` for stage 0, ``pp<k>/w<rank>.sock`` for the others, as kvcached
lays them out) and an ``owner.json`` naming the process that created it, so :func:`gc_sockets`
can remove what a SIGKILLed owner left behind."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import time
from pathlib import Path

from workbench.core.coordinator import WorkerId
from workbench.errors import ConfigError
from workbench.procs import pid_alive, proc_start_time
from workbench.settings import settings

SOCKET_DIR_ENV = "WORKBENCH_KV_SOCKET_DIR"
MAX_SOCK_PATH = 107  # sun_path is 108 bytes with its NUL
OWNER_FILE = "owner.json"
GC_GRACE_S = 5.0  # a directory this young may still be getting its owner file


def base_dir() -> Path:
    """The per-user base directory, created 0700; refused if someone else could write it."""
    base = Path(settings().socket_dir or f"/tmp/workbench-kv-{os.getuid()}")
    try:
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"socket directory {base}", f"cannot be created ({err})",
                          f"set {SOCKET_DIR_ENV} to a writable directory") from err
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ConfigError(f"socket directory {base}",
                          "is not a private directory owned by you (mode 0700)",
                          f"remove it, or set {SOCKET_DIR_ENV} to a fresh path")
    return base


def make_pool_dir(name: str) -> Path:
    """A fresh 0700 directory for one pool's sockets, owned by this process."""
    safe = "".join(c if c.isalnum() or c in "_-" else "_" for c in name)[:24] or "pool"
    path = base_dir() / f"{safe}-{os.getpid()}-{secrets.token_hex(3)}"
    path.mkdir(mode=0o700)
    owner = {"pid": os.getpid(), "start": proc_start_time(os.getpid()), "name": name,
             "created": time.time()}
    tmp = path / (OWNER_FILE + ".tmp")
    tmp.write_text(json.dumps(owner))
    tmp.rename(path / OWNER_FILE)
    return path


def socket_path(pool_dir: Path, wid: WorkerId) -> Path:
    """``w<tp>.sock`` for stage 0, ``pp<k>/w<tp>.sock`` for the others (the PP namespace)."""
    path = pool_dir / f"w{wid.tp}.sock" if wid.pp == 0 else pool_dir / f"pp{wid.pp}" / \
        f"w{wid.tp}.sock"
    if len(os.fsencode(path)) > MAX_SOCK_PATH:
        raise ConfigError(f"socket path {path}", f"longer than {MAX_SOCK_PATH} bytes",
                          f"set {SOCKET_DIR_ENV} to a shorter directory")
    path.parent.mkdir(mode=0o700, exist_ok=True)
    return path


def remove_pool_dir(pool_dir: Path) -> None:
    shutil.rmtree(pool_dir, ignore_errors=True)


def gc_sockets(base: Path | None = None) -> list[str]:
    """Remove socket directories whose owner process is gone; return the paths removed."""
    base = base or base_dir()
    removed = []
    for entry in sorted(base.iterdir()) if base.exists() else []:
        if not entry.is_dir() or entry.is_symlink():
            continue
        try:
            owner = json.loads((entry / OWNER_FILE).read_text())
            alive = pid_alive(int(owner["pid"]), owner.get("start"))
        except (OSError, ValueError, KeyError, TypeError):
            # no owner file: only stale ones (not a directory being created right now)
            try:
                alive = time.time() - entry.stat().st_mtime < GC_GRACE_S
            except OSError:
                continue
        if not alive:
            remove_pool_dir(entry)
            removed.append(str(entry))
    return removed
