"""Hostile ``WORKBENCH_KV_*`` environments: every bad value is refused in one line that names the
variable, the value and what is accepted; an unknown name is refused too (``doctor`` lists it,
``doctor --check`` fails on it)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.config import PoolConfig
from workbench.errors import ConfigError
from workbench.settings import GRANULE, Settings, _build, known_names, unknown_names
from workbench.settings import settings as read_settings

P = "WORKBENCH_KV_"


@pytest.mark.parametrize("env, message", [
    ({"PAGE_SIZE": "3MiB"}, "WORKBENCH_KV_PAGE_SIZE='3MiB': not a multiple of the 2 MiB page "
     "granularity. Fix: use a multiple of 2 MiB from 2 MiB to 1 GiB (e.g. 2MiB, 4MiB)"),
    ({"MEMORY_LIMIT": "0"}, "WORKBENCH_KV_MEMORY_LIMIT='0': out of range. Fix: use a multiple "
     "of 2 MiB from 2 MiB to 1 PiB (e.g. 512MiB, 8G)"),
    ({"MEMORY_LIMIT": "9" * 40 + "G"}, "WORKBENCH_KV_MEMORY_LIMIT='" + "9" * 35 + "...': out "
     "of range. Fix: use a multiple of 2 MiB from 2 MiB to 1 PiB (e.g. 512MiB, 8G)"),
    ({"MEMORY_LIMIT": "1e400"}, "WORKBENCH_KV_MEMORY_LIMIT='1e400': not a size. Fix: use a "
     "multiple of 2 MiB from 2 MiB to 1 PiB (e.g. 512MiB, 8G)"),
    ({"MAX_RESERVED_PAGES": "99999999999999999999"}, "WORKBENCH_KV_MAX_RESERVED_PAGES="
     "'99999999999999999999': out of range. Fix: use an integer from 0 to 4096, at least "
     "min_reserved_pages"),
    ({"MIN_RESERVED_PAGES": "2.0"}, "WORKBENCH_KV_MIN_RESERVED_PAGES='2.0': not an integer. "
     "Fix: use an integer from 0 to 4096, at most max_reserved_pages"),
    ({"MIN_RESERVED_PAGES": "20"}, "WORKBENCH_KV_MIN_RESERVED_PAGES='20' with "
     "WORKBENCH_KV_MAX_RESERVED_PAGES at its default 10: the minimum reserve exceeds the maximum. "
     "Fix: use min <= max, each an integer from 0 to 4096"),
    ({"MAX_RESERVED_PAGES": "1", "MIN_RESERVED_PAGES": "3"}, "WORKBENCH_KV_MIN_RESERVED_PAGES='3'"
     " with WORKBENCH_KV_MAX_RESERVED_PAGES='1': the minimum reserve exceeds the maximum. Fix: "
     "use min <= max, each an integer from 0 to 4096"),
    ({"GPU_UTILIZATION": "nan"}, "WORKBENCH_KV_GPU_UTILIZATION='nan': out of range. Fix: use a "
     "number from 0.01 to 1, e.g. 0.95"),
    ({"GPU_UTILIZATION": "0"}, "WORKBENCH_KV_GPU_UTILIZATION='0': out of range. Fix: use a "
     "number from 0.01 to 1, e.g. 0.95"),
    ({"MAX_CACHED_TOKENS": "-2"}, "WORKBENCH_KV_MAX_CACHED_TOKENS='-2': out of range. Fix: use "
     "-1 (unbounded), 0 (evict at once) or a count up to 1099511627776"),
    ({"PREALLOC": "maybe"}, "WORKBENCH_KV_PREALLOC='maybe': not a yes/no value. Fix: use one of "
     "1, 0, true, false, yes, no, on, off"),
    ({"IPC_NAME": "llama\n"}, "WORKBENCH_KV_IPC_NAME='llama\\n': not a valid IPC name. Fix: use "
     "1-64 characters of letters, digits, '_', '-' or '.'"),
    ({"SHM_DIR": "relative/dir"}, "WORKBENCH_KV_SHM_DIR='relative/dir': not an absolute path. "
     "Fix: use an absolute directory path"),
])
def test_each_bad_value_is_one_exact_line(env, message):
    with pytest.raises(ConfigError) as err:
        read_settings({P + k: v for k, v in env.items()})
    assert str(err.value) == message


def test_good_values_reach_the_pool_config():
    env = {P + "PAGE_SIZE": "4MiB", P + "MEMORY_LIMIT": "1.5G", P + "PREALLOC": "off",
           P + "MIN_RESERVED_PAGES": "1", P + "MAX_RESERVED_PAGES": " 3 ",
           P + "GPU_UTILIZATION": "0.5", P + "IPC_NAME": "llama_a", "PATH": "/bin"}
    cfg = PoolConfig.from_env(env, prealloc=True)
    assert cfg == PoolConfig(page_size=4 << 20, memory_limit=1536 << 20, prealloc=True,
                             min_reserved_pages=1, max_reserved_pages=3, gpu_utilization=0.5,
                             ipc_name="llama_a")
    assert PoolConfig.from_env({}) == PoolConfig()


def test_the_process_environment_is_read(monkeypatch):
    monkeypatch.setenv(P + "VLLM_STANDALONE", "yes")
    monkeypatch.setenv(P + "SOCKET_DIR", "/tmp/wb-sockets")
    s = read_settings()
    assert (s.vllm_standalone, s.socket_dir, s.autopatch) == (True, "/tmp/wb-sockets", False)
    assert read_settings() is s  # built once for an unchanged environment
    monkeypatch.setenv(P + "PAGE_SIZE", "3MiB")
    with pytest.raises(ConfigError, match="^WORKBENCH_KV_PAGE_SIZE='3MiB'"):
        read_settings()
    assert read_settings(only="vllm_standalone").vllm_standalone is True  # import-time readers


def test_unknown_names_are_refused_with_the_name_meant():
    _build.cache_clear()
    env = {P + "PAGESIZE": "4MiB", P + "PAGE_SIZE": "4MiB"}
    with pytest.raises(ConfigError) as err:
        read_settings(env)
    assert str(err.value) == ("WORKBENCH_KV_PAGESIZE='4MiB': not a workbench setting. Fix: did "
                              "you mean WORKBENCH_KV_PAGE_SIZE? Else unset it")
    assert unknown_names(env) == [P + "PAGESIZE"]
    with pytest.raises(ConfigError, match="^WORKBENCH_KV_BOGUS='1': not a workbench setting. "
                       r"Fix: unset it \(docs/adapters.md lists every setting\)$"):
        read_settings({P + "BOGUS": "1"})
    assert read_settings(env, only="page_size").page_size == 4 << 20  # import-time readers


names = st.sampled_from(sorted(known_names()) + [P + "BOGUS", P + "page_size", P, "OTHER"])
values = st.one_of(
    st.text(max_size=30), st.integers(-(1 << 70), 1 << 70).map(str),
    st.floats(allow_nan=True).map(str),
    st.sampled_from(["2MiB", "4MiB", "3MiB", "0", "1", "-1", "yes", "off", "/tmp/x", "1e400",
                     "9" * 50, "0.95", "llama_a", "a/b", "", " 8G "]))


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(env=st.dictionaries(names, values, max_size=6))
def test_any_environment_parses_or_is_refused_in_one_line(env):
    try:
        s = read_settings(env)
    except ConfigError as err:
        text = str(err)
        var = text.split("=", 1)[0]
        assert "\n" not in text and var in env
        if var in known_names():
            assert "Fix: use " in text
        else:  # unknown names are refused first
            assert var == unknown_names(env)[0] and "not a workbench setting" in text
        return
    assert isinstance(s, Settings)
    assert s.page_size % GRANULE == 0 and 0 <= s.min_reserved_pages <= s.max_reserved_pages
    assert s.memory_limit is None or s.memory_limit >= GRANULE
    assert 0 < s.gpu_utilization <= 1
    cfg = PoolConfig.from_env(env)  # whatever parses makes a valid pool config
    assert cfg.page_size == s.page_size and cfg.memory_limit == s.memory_limit


def _doctor(*args: str, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(P)} | extra
    return subprocess.run([sys.executable, "-m", "workbench", "doctor", *args], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, extra, code, line", [
    (("--check",), {}, 0, None),
    (("--check",), {P + "PAGESIZE": "4MiB"},
     1, "UNKNOWN SETTING: WORKBENCH_KV_PAGESIZE is not a workbench setting (a typo?)"),
    ((), {P + "PAGESIZE": "4MiB"},
     0, "UNKNOWN SETTING: WORKBENCH_KV_PAGESIZE is not a workbench setting (a typo?)"),
    (("--check",), {P + "MEMORY_LIMIT": "0"},
     1, "BAD CONFIG: WORKBENCH_KV_MEMORY_LIMIT='0': out of range. Fix: use a multiple of 2 MiB "
        "from 2 MiB to 1 PiB (e.g. 512MiB, 8G)"),
])
def test_doctor_check_refuses_unknown_and_bad_names(args, extra, code, line):
    r = _doctor(*args, **extra)
    assert r.returncode == code, r.stderr
    assert "Traceback" not in r.stderr
    lines = [x.strip() for x in r.stdout.splitlines()]
    if line is None:
        assert not any(x.startswith(("UNKNOWN SETTING", "BAD CONFIG")) for x in lines)
    else:
        assert line in lines


@pytest.mark.parametrize("argv", [["kvctl", "list"], ["kvtop", "--once"], ["labs", "list"]])
def test_a_bad_value_read_at_start_up_is_one_line_for_every_command(argv):
    """The shm directory is read while the CLI imports; its refusal is still one line, exit 2."""
    env = {**os.environ, "WORKBENCH_KV_SHM_DIR": "relative/dir"}
    out = subprocess.run([sys.executable, "-m", "workbench", *argv], capture_output=True,
                         text=True, env=env, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == ["error: WORKBENCH_KV_SHM_DIR='relative/dir': not an "
                                       "absolute path. Fix: use an absolute directory path"]
