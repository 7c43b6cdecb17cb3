"""``--help`` of every command reads as plain text: no reStructuredText, no sentence broken
early, no option or description cut off, choices shown."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from workbench.cli import app

from .commands import leaves, option, options, walk

WIDTH = 80
MARKUP = re.compile(r"``|:(mod|func|class|meth|data|attr):|\[/?(bold|red|green)\]")
ALL = [p for p, _ in walk()]


def _help(path: tuple[str, ...]) -> str:
    res = CliRunner().invoke(app, [*path, "--help"], terminal_width=WIDTH)
    assert res.exit_code == 0, res.output
    return res.output


def _paragraph_lines(text: str) -> list[tuple[str, str]]:
    """Consecutive lines of one wrapped paragraph: in the description (before the first
    ``Options:``-like header), and an option's help carried onto a further, deeper line."""
    pairs, in_description = [], True
    lines = text.splitlines()[1:]  # not the Usage line
    for a, b in zip(lines, lines[1:], strict=False):
        if b.rstrip().endswith(":") and not b.startswith(" "):
            in_description = False
        if not (a.strip() and b.strip()) or b.lstrip().startswith(("-", "[")):
            continue
        if a.lstrip().startswith("-") and "  " not in a.strip():
            continue  # a long option alone on its line: its help starts on the next
        indent = len(b) - len(b.lstrip())
        if (in_description and indent == 2) or (not in_description and indent > 2):
            pairs.append((a, b))
    return pairs


@pytest.mark.parametrize("path", ALL, ids=[" ".join(p) or "workbench" for p in ALL])
def test_help_is_plain_and_whole(path):
    text = _help(path)
    assert not MARKUP.search(text), MARKUP.search(text)
    body = "\n".join(ln for ln in text.splitlines() if not ln.startswith("Usage:"))
    assert "…" not in body and not re.search(r"\.\.\.$", body, re.M), body
    assert "╭" not in text  # plain click help, not a box cut to the terminal
    for a, b in _paragraph_lines(text):
        first = b.split()[0]
        # a line ended early although the next word would have fitted: a docstring's line break
        assert len(a) + 1 + len(first) > WIDTH or a.rstrip().endswith((".", ":", ";")), (a, b)


@pytest.mark.parametrize("path,cmd", leaves(), ids=[" ".join(p) for p, _ in leaves()])
def test_every_option_shown_in_full(path, cmd):
    text = _help(path)
    for p in options(cmd):
        for name in p.opts:
            assert re.search(rf"(^|[\s,]){re.escape(name)}([\s,=]|$)", text, re.M), name


@pytest.mark.parametrize("path,name,choices", [
    (("serve",), "--style", ["block", "token"]),
    (("serve",), "--kv", ["vmm", "static"]),
    (("serve",), "--model", ["tiny", "llama-3.1-8b"]),
    (("serve",), "--device", ["auto", "cpu", "cuda", "cuda:N"]),
    (("bench", "crossover"), "--backend", ["gpu", "host", "cuda:N"]),
    (("bench", "crossover"), "--model", ["tiny", "llama-3.1-8b"]),
    (("labs", "run"), "--backend", ["sim", "host", "gpu", "cuda:N"]),
    (("replay",), "--backend", ["sim", "host", "gpu", "cuda:N"]),
])
def test_choices_in_help(path, name, choices):
    text = " ".join(_help(path).split())
    shown = re.search(rf"{name} [<\[]([^>\]]+)[>\]]", text)
    assert shown, text
    assert sorted(shown.group(1).split("|")) == sorted(choices)


def test_flags_are_one_way():
    """A bool option is one flag (``--once``, ``--no-events`` when on by default), never a
    ``--x/--no-x`` pair; each takes no value."""
    for path, cmd in leaves():
        for p in options(cmd):
            if p.is_flag and p.name != "help":
                assert not p.secondary_opts, (path, p.opts, p.secondary_opts)
                assert p.default is False, (path, p.opts)


def test_a_bad_choice_is_refused_with_the_choices():
    res = CliRunner().invoke(app, ["serve", "--style", "paged"])
    assert res.exit_code == 2 and "block" in res.output and "token" in res.output
    assert option(next(c for p, c in leaves() if p == ("serve",)), "--style") is not None


@pytest.mark.parametrize("path", ALL, ids=[" ".join(p) or "workbench" for p in ALL])
def test_metavars_read_as_argparse_writes_them(path):
    """``--port PORT`` and an argument ``NAME``, not typer's ``<int>`` or ``{name}``."""
    text = _help(path)
    assert not re.search(r"<(str|int|float|path|file|list\[[a-z]+\])( range)?>|\{[a-z_]+\}",
                         text), text


def test_version_is_the_package_version():
    from workbench import __version__

    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.stdout == f"workbench {__version__}\n"
