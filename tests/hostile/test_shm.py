"""Hostile entries in /dev/shm under a segment's name: every reader skips each with one line, never
crashes, hangs or deletes it; only what is provably ours and dead is collected by `kvctl gc`."""

from __future__ import annotations

import json
import os
import signal
import stat
import struct
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.config import PoolConfig
from workbench.core import control, segment
from workbench.core.geometry import KVGeometry
from workbench.core.ledger import KVCacheManager
from workbench.errors import ConfigError
from workbench.procs import my_identity
from workbench.sim.device import SimDevice
from workbench.units import MiB

ROOT = Path(__file__).parents[2]


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """A CLI run that must end within 60 s (a FIFO that blocked a reader would time out)."""
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True,
                          text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "COLUMNS": "250", **(env or {})})


def seg_bytes(pid: int, start: int = 0, pages: int = 4, **over) -> bytearray:
    """A well-formed version-2 segment; ``over`` overrides header fields (magic/version too)."""
    v = dict.fromkeys(segment.FIELDS, 0)
    v.update(owner_pid=pid, owner_start=start, num_pages=pages, page_id_bytes=2 * MiB,
             capacity=pages * 2 * MiB, limit=pages * 2 * MiB, heartbeat_ns=1)
    magic, version = over.pop("magic", segment.MAGIC), over.pop("version", segment.VERSION)
    v.update(over)
    return bytearray(segment.HEAD.pack(magic, version, segment.HEADER_SIZE)
                     + segment.BODY.pack(*(v[f] for f in segment.FIELDS)) + bytes(pages))


def with_pid(pid: int) -> bytearray:
    data = seg_bytes(1)
    struct.pack_into("<Q", data, segment.OFF["owner_pid"], pid % (1 << 64))
    return data


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _write(data: bytes):
    return lambda path: path.write_bytes(data)


def _symlink_to_good(path: Path, good: str) -> None:
    path.symlink_to(control.segment_path(good))


ME, MY_START = my_identity()
# kind -> (plant(path, good_name), words in its one line, collected by gc?)
PLANTS = {
    "fifo": (lambda p, g: os.mkfifo(p, 0o600), "a FIFO", False),
    "directory": (lambda p, g: p.mkdir(), "a directory", False),
    "empty": (lambda p, g: p.write_bytes(b""), "0 bytes, shorter than", False),
    "symlink": (_symlink_to_good, "a symbolic link", False),
    "truncated": (lambda p, g: p.write_bytes(seg_bytes(ME)[:40]), "40 bytes, shorter", False),
    "bad_magic": (lambda p, g: p.write_bytes(seg_bytes(ME, magic=b"NOTASEG\0")), "no segment "
                  "magic", False),
    "bad_version": (lambda p, g: p.write_bytes(seg_bytes(ME, version=1)), "segment version 1",
                    False),
    "pid_2_31": (lambda p, g: p.write_bytes(with_pid(1 << 31)), "pid 2147483648 is not", False),
    "pid_2_63": (lambda p, g: p.write_bytes(with_pid(1 << 63)), "is not a valid pid", False),
    "pid_negative": (lambda p, g: p.write_bytes(with_pid(-5)), "pid -5 is not a valid", False),
    "too_long": (lambda p, g: p.write_bytes(seg_bytes(ME) + b"x"), "need exactly", False),
    "pid_reused": (lambda p, g: p.write_bytes(seg_bytes(ME, MY_START + 7)), None, True),
    "dead_owner": (lambda p, g: p.write_bytes(seg_bytes(dead_pid(), 1)), None, True),
}


@pytest.fixture
def good():
    """A live pool with a control segment, owned by this test process."""
    name = f"hg_{uuid.uuid4().hex[:10]}"
    kv = KVCacheManager(KVGeometry(num_layers=2, kv_heads=8, head_dim=128, num_blocks=640),
                        SimDevice(), config=PoolConfig(ipc_name=name))
    yield name
    kv.close()
    assert not control.segment_path(name).exists()


@pytest.fixture
def plant():
    planted: list[Path] = []

    def make(kind: str, good: str) -> tuple[str, Path]:
        name = f"hx_{kind}_{uuid.uuid4().hex[:8]}"
        path = control.segment_path(name)
        PLANTS[kind][0](path, good)
        planted.append(path)
        return name, path

    yield make
    for path in planted:
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink(missing_ok=True)


def lines_naming(text: str, path: Path) -> list[str]:
    return [ln for ln in text.splitlines() if f"{path}:" in ln]


def assert_calm(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stdout + r.stderr


@pytest.mark.parametrize("kind", sorted(PLANTS))
def test_a_planted_entry_is_skipped_by_the_readers_in_process(kind, good, plant):
    name, path = plant(kind, good)
    _, words, ours_and_dead = PLANTS[kind]
    found = control.scan()
    assert good in [i.name for i in found.infos]
    if ours_and_dead:  # well formed, ours, owner gone: listed as dead, then collected
        info = next(i for i in found.infos if i.name == name)
        assert not info.alive
        assert control.gc_segments(only=name) == [name] and not os.path.lexists(path)
        return
    assert name not in [i.name for i in found.infos]
    mine = [e for e in found.skipped if e.path == str(path)]
    assert len(mine) == 1 and words in str(mine[0]) and "\n" not in str(mine[0])
    with pytest.raises(segment.SegmentRefused, match=words):
        control.read_segment(name)
    report: list[segment.SegmentRefused] = []
    assert control.gc_segments(only=name, report=report) == []
    assert [str(e) for e in report if e.path == str(path)] == [str(mine[0])]
    assert os.path.lexists(path)  # never deleted: not provably ours and dead


def test_every_reader_survives_all_plants_at_once(good, plant):
    planted = {kind: plant(kind, good) for kind in PLANTS}
    bad = {k: p for k, (_, p) in planted.items() if not PLANTS[k][2]}
    runs = {"list": cli("kvctl", "list"), "list -v": cli("kvctl", "list", "--verbose"),
            "list --json": cli("kvctl", "list", "--json"),
            "watch": cli("kvctl", "watch", "--count", "2", "--interval", "0.01", "--json"),
            "kvtop": cli("kvtop", "--once"), "kvtop --json": cli("kvtop", "--json")}
    for what, r in runs.items():
        assert_calm(r)
        assert good in r.stdout, what
        if what in ("list", "list --json"):
            assert "--verbose names them" in r.stderr
            continue
        for kind, path in bad.items():  # each bad entry in exactly one line
            assert len(lines_naming(r.stderr, path)) == 1, (what, kind, r.stderr)
            assert PLANTS[kind][1] in lines_naming(r.stderr, path)[0]
    rows = {r["name"]: r for r in json.loads(runs["list --json"].stdout)}
    assert rows[good]["alive"] and not rows[planted["pid_reused"][0]]["alive"]
    assert not set(rows) & {n for n, _ in planted.values()} - {planted["pid_reused"][0],
                                                               planted["dead_owner"][0]}
    assert all(os.path.lexists(p) for _, p in planted.values())  # readers delete nothing
    r = cli("kvctl", "gc", "--json")
    assert_calm(r)
    assert set(json.loads(r.stdout)["segments"]) >= {planted["pid_reused"][0],
                                                     planted["dead_owner"][0]}
    assert all(os.path.lexists(p) for p in bad.values())
    assert not os.path.lexists(planted["dead_owner"][1])
    assert control.read_segment(good).alive


def test_list_counts_what_it_skipped_and_why(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    os.mkfifo(shm / "wbkv_a", 0o600)
    (shm / "wbkv_b").mkdir()
    (shm / "wbkv_c").write_bytes(b"")
    (shm / "wbkv_d\n").write_bytes(seg_bytes(ME, MY_START))
    r = cli("kvctl", "list", env={"WORKBENCH_KV_SHM_DIR": str(shm)})
    assert_calm(r)
    assert r.stdout.strip() == "no pools"
    assert r.stderr.splitlines() == [
        f"skipped 4 entries in {shm} that are not segments of yours (1 bad name, 1 malformed, "
        "2 not a regular file); --verbose names them"]
    r = cli("kvctl", "list", "--verbose", env={"WORKBENCH_KV_SHM_DIR": str(shm)})
    assert r.stderr.splitlines() == [
        f"skipped {shm}/wbkv_a: a FIFO, not a segment",
        f"skipped {shm}/wbkv_b: a directory, not a segment",
        f"skipped {shm}/wbkv_c: 0 bytes, shorter than the {segment.HEADER_SIZE}-byte header "
        "(empty or half-written)",
        f"skipped {shm}/wbkv_d\\n: the name contains a control character (a newline, tab or NUL)"]


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_another_users_segment_is_skipped_and_kept(good, plant):
    name, path = plant("dead_owner", good)
    os.chown(path, 65534, 65534)
    r = cli("kvctl", "list", "--verbose")
    assert_calm(r)
    assert lines_naming(r.stderr, path) == [f"skipped {path}: owned by uid 65534, not by this "
                                            f"user (uid {os.getuid()})"]
    for args in (("kvtop", "--once"), ("kvctl", "gc")):
        assert_calm(cli(*args))
    assert path.exists()  # dead, but not ours: never collected
    r = cli("kvctl", "limit", name, "8M")
    assert r.returncode == 2 and "owned by uid 65534" in r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_a_device_node_is_never_opened(good, plant):
    name, path = plant("empty", good)
    path.unlink()
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # the null device, under a pool name
    for args in (("kvctl", "list", "--verbose"), ("kvtop", "--once"), ("kvctl", "gc", "-v")):
        r = cli(*args)
        assert_calm(r)
        assert lines_naming(r.stderr, path) == [f"skipped {path}: a character device, not a "
                                                "segment"]
    assert stat.S_ISCHR(os.lstat(path).st_mode)


@pytest.mark.parametrize("kind", ["fifo", "empty", "pid_2_31", "bad_version", "symlink"])
def test_commands_naming_a_bad_entry_fail_in_one_line_and_write_nothing(kind, good, plant):
    name, path = plant(kind, good)
    before = path.read_bytes() if kind in ("empty", "pid_2_31", "bad_version") else None
    for args in (("limit", name, "8M"), ("watch", name, "--count", "1"), ("delete", name)):
        r = cli("kvctl", *args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, args
        assert len(r.stderr.strip().splitlines()) == 1 and PLANTS[kind][1] in r.stderr, args
    assert os.path.lexists(path)
    if before is not None:
        assert path.read_bytes() == before
    assert control.read_segment(good).alive  # the symlink's target is untouched


def test_an_owner_killed_before_its_segment_was_complete_is_cleaned_up():
    name = f"hk_{uuid.uuid4().hex[:10]}"
    killer = textwrap.dedent("""
        import os, signal, sys
        from workbench.config import PoolConfig
        from workbench.core import control
        from workbench.core.geometry import KVGeometry
        from workbench.core.ledger import KVCacheManager
        from workbench.sim.device import SimDevice
        control._claim = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # dies mid-creation
        KVCacheManager(KVGeometry(num_layers=2, kv_heads=8, head_dim=128), SimDevice(),
                       config=PoolConfig(ipc_name=sys.argv[1]))
    """)
    p = subprocess.run([sys.executable, "-c", killer, name], cwd=ROOT, timeout=60)
    assert p.returncode == -signal.SIGKILL
    assert not control.segment_path(name).exists()  # never appears half-written
    left = [e for e in os.listdir(segment.SHM_DIR)
            if e.startswith(segment.PARTIAL_PREFIX) and e.endswith("_" + name)]
    assert len(left) == 1
    r = cli("kvctl", "list", "--verbose")
    assert_calm(r)
    assert lines_naming(r.stderr, segment.SHM_DIR / left[0]) == [
        f"skipped {segment.SHM_DIR / left[0]}: half-written by a process that is gone; "
        "`workbench kvctl gc` removes it"]
    r = cli("kvctl", "gc", "--json")
    assert_calm(r)
    assert left[0] in json.loads(r.stdout)["segments"]
    assert not (segment.SHM_DIR / left[0]).exists()


def test_the_next_owner_takes_over_dead_leftovers_and_refuses_foreign_ones(plant):
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128)
    name = f"hn_{uuid.uuid4().hex[:10]}"
    partial = segment.SHM_DIR / f"{segment.PARTIAL_PREFIX}{dead_pid()}_1_abcd_{name}"
    partial.write_bytes(b"")
    control.segment_path(name).write_bytes(seg_bytes(ME, MY_START + 3))  # pid reused: dead
    kv = KVCacheManager(geo, SimDevice(), config=PoolConfig(ipc_name=name))
    try:
        assert not partial.exists()
        info = control.read_segment(name)
        assert (info.owner_pid, info.owner_start, info.alive) == (ME, MY_START, True)
    finally:
        kv.close()
    empty, path = plant("empty", "unused")
    with pytest.raises(ConfigError, match="exists and is not a usable segment"):
        KVCacheManager(geo, SimDevice(), config=PoolConfig(ipc_name=empty))
    assert path.exists() and path.read_bytes() == b""


@pytest.mark.parametrize("name", ["a\n", "a/b", "..", "", "x" * 65, "a\x00b", "tab\t", "é"])
def test_bad_names_are_refused_at_every_entry_point(name):
    with pytest.raises(ConfigError, match="IPC name"):
        control.segment_path(name)
    if "\x00" not in name and name:
        r = cli("kvctl", "limit", name, "8M")
        assert r.returncode == 2 and "IPC name" in r.stderr and "Traceback" not in r.stderr


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=segment.HEADER_SIZE + 64))
def test_the_parser_refuses_random_bytes_with_a_typed_error(data):
    try:
        v, codes = segment.parse(data)
    except segment.SegmentRefused as err:
        assert "\n" not in str(err)
        return
    assert len(codes) == v["num_pages"]
    control.SegmentInfo.of("x", v, codes)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, segment.HEADER_SIZE + 3), st.integers(0, 255)),
                max_size=6), st.integers(-3, 3))
def test_the_parser_refuses_mutated_segments_with_a_typed_error(edits, grow):
    data = seg_bytes(ME, MY_START)
    for at, byte in edits:
        data[at % len(data)] = byte
    data = data[:len(data) + grow] if grow < 0 else data + bytes(grow)
    try:
        v, codes = segment.parse(bytes(data))
    except segment.SegmentRefused:
        return
    info = control.SegmentInfo.of("x", v, codes)
    assert info.num_pages == len(info.page_states) and info.owner_pid > 0
