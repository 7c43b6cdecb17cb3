"""The ``workbench`` console script. One module per command; each registers itself on ``app``."""

from __future__ import annotations

import errno
import sys

from workbench.cli.root import SETTINGS_OWN, app
from workbench.errors import WorkbenchError
from workbench.terminal import plain

__all__ = ["SETTINGS_OWN", "app", "main"]

# Each import adds its command(s) to ``app``; keep one line per command module. A bad
# WORKBENCH_KV_* value read while importing (the shm directory) is kept for main() to report in
# one line, as any other WorkbenchError is.
_startup_error: WorkbenchError | None = None
try:
    from workbench.cli import bench as _bench  # noqa: F401
    from workbench.cli import doctor as _doctor  # noqa: F401
    from workbench.cli import kvctl as _kvctl  # noqa: F401
    from workbench.cli import kvexport as _kvexport  # noqa: F401
    from workbench.cli import kvtop as _kvtop  # noqa: F401
    from workbench.cli import lab as _lab  # noqa: F401
    from workbench.cli import labs as _labs  # noqa: F401
    from workbench.cli import replay as _replay  # noqa: F401
    from workbench.cli import serve as _serve  # noqa: F401
except WorkbenchError as err:
    _startup_error = err


def main() -> None:
    """Run the CLI; a WorkbenchError that no command caught is one ``error:`` line, exit 2;
    stdout that takes nothing more (closed, a full device) ends it quietly, exit 1."""
    from workbench.outfiles import StdoutLost, drop_stdout, guard_stdout

    guard_stdout()
    try:
        try:
            _run()
        finally:
            sys.stdout.flush()
    except StdoutLost as err:
        drop_stdout()
        if err.errno != errno.EPIPE:  # a closed pipe is the reader's choice; the rest is said
            try:
                print(f"error: stdout: {err.strerror}", file=sys.stderr)
            except OSError:
                pass
        raise SystemExit(1) from None


def _run() -> None:
    try:
        if _startup_error is not None:
            raise _startup_error
        app()
    except WorkbenchError as err:
        from workbench.cli.common import cli_syntax

        print(f"error: {plain(cli_syntax(' '.join(str(err).split())))}", file=sys.stderr)
        raise SystemExit(2) from None
    except ImportError as err:  # an optional module (torch, cuda-python) a command needs
        from workbench.cli.common import missing

        found = missing(err, " ".join(sys.argv[1:3]))
        if isinstance(found, ImportError):
            raise
        raise SystemExit(found.exit_code) from None
