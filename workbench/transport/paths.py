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

from workbench import strictjson
from workbench.core.coordinator import WorkerId
from workbench.errors import ConfigError
from workbench.procs import my_identity, pid_alive, proc_start_time, valid_pid
from workbench.settings import settings

SOCKET_DIR_ENV = "WORKBENCH_KV_SOCKET_DIR"
MAX_SOCK_PATH = 107  # sun_path is 108 bytes with its NUL
OWNER_FILE = "owner.json"
PARTIAL = ".new-"  # a directory still being set up
OWNER_MAX = 4096


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
    """A fresh 0700 directory for one pool's sockets, owned by this process.

    It appears under its name only with its owner file in it: it is built as
    ``.new-<pid>-<start>-<token>`` and renamed, so a crash mid-way leaves a ``.new-`` directory
    whose name says whose it was (and :func:`gc_sockets` removes it once that process is gone)."""
    safe = "".join(c if c.isalnum() or c in "_-" else "_" for c in name)[:24] or "pool"
    pid, start = my_identity()
    token = secrets.token_hex(3)
    tmp = base_dir() / f"{PARTIAL}{pid}-{start}-{token}"
    tmp.mkdir(mode=0o700)
    owner = {"pid": pid, "start": start or None, "name": name, "created": time.time()}
    (tmp / OWNER_FILE).write_text(json.dumps(owner))
    path = tmp.parent / f"{safe}-{pid}-{token}"
    tmp.rename(path)
    return path


def shared_dir(name: str, owner_pid: int) -> Path:
    """The directory ``name`` that several processes meet in (a vLLM engine core and its
    workers), owned by ``owner_pid``: whoever comes first creates it with the owner file (built
    aside and renamed, as :func:`make_pool_dir` does), the others find it. :func:`gc_sockets`
    removes it once that owner is gone."""
    path = base_dir() / name
    if path.is_dir():
        return path
    pid, start = my_identity()
    tmp = base_dir() / f"{PARTIAL}{pid}-{start}-{secrets.token_hex(3)}"
    tmp.mkdir(mode=0o700)
    owner = {"pid": owner_pid, "start": proc_start_time(owner_pid), "name": name,
             "created": time.time()}
    (tmp / OWNER_FILE).write_text(json.dumps(owner))
    try:
        tmp.rename(path)
    except OSError:  # another process made it first
        remove_pool_dir(tmp)
        if not path.is_dir():
            raise
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


def _read_owner(entry: Path) -> dict:
    """The owner file of a socket directory, checked like a segment: a regular file of this
    user (no symlink, no FIFO), small, JSON naming a valid pid. ValueError says what is wrong."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(entry / OWNER_FILE, flags)
    except OSError as err:
        raise ValueError(f"no readable {OWNER_FILE} ({err.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size > OWNER_MAX:
            raise ValueError(f"{OWNER_FILE} is not a small regular file of this user")
        data = os.read(fd, OWNER_MAX + 1)
    finally:
        os.close(fd)
    try:
        owner = strictjson.loads(data)
    except ValueError:
        raise ValueError(f"{OWNER_FILE} is not JSON") from None
    start = owner.get("start") if isinstance(owner, dict) else None
    if not isinstance(owner, dict) or not valid_pid(owner.get("pid")) or not (
            start is None or (type(start) is int and start >= 0)):
        raise ValueError(f"{OWNER_FILE} does not name a valid pid and start time")
    return owner


def _dir_alive(entry: Path) -> bool:
    """Is the owner of socket directory ``entry`` alive? ValueError if it is not provably one of
    ours (foreign, a symlink, no owner file, malformed)."""
    st = os.lstat(entry)
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError("not a directory")
    if st.st_uid != os.getuid():
        raise ValueError(f"owned by uid {st.st_uid}, not by this user")
    if entry.name.startswith(PARTIAL):  # .new-<pid>-<start>-<token>: a crashed make_pool_dir
        parts = entry.name[len(PARTIAL):].split("-")
        if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
            pid, start = int(parts[0]), int(parts[1])
            if valid_pid(pid):
                return pid_alive(pid, start or None)
        raise ValueError("named like a directory being created, but not by a workbench")
    owner = _read_owner(entry)
    return pid_alive(owner["pid"], owner.get("start"))


def gc_sockets(base: Path | None = None, report: list[str] | None = None) -> list[str]:
    """Remove socket directories whose owner process (pid and start time) is gone; return the
    paths removed. Anything else is left alone, with one line each in ``report``."""
    base = base or base_dir()
    removed = []
    try:
        entries = sorted(base.iterdir())
    except OSError:
        entries = []
    for entry in entries:
        try:
            alive = _dir_alive(entry)
        except (OSError, ValueError) as err:
            if report is not None:
                report.append(f"skipped {base}/{ascii(entry.name)[1:-1]}: {err}")
            continue
        if not alive:
            remove_pool_dir(entry)
            removed.append(str(entry))
    return removed
