"""Install / remove the ``.pth`` file that boots autopatch at interpreter start.

``python -m workbench.adapters.pth install|uninstall|status`` (in the engine's venv). The line
imports nothing from the workbench unless ``WORKBENCH_KV_AUTOPATCH`` or ``WORKBENCH_KV_STEP_LOG``
(the step recorder, which also observes a stock engine) is set, so an interpreter
with autopatch off starts as fast as before. Child processes (vLLM's spawned EngineCore, SGLang's
scheduler) run it too: that is why patching starts from a ``.pth`` and not from user code.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

from workbench.outfiles import write_text

NAME = "workbench_autopatch.pth"
LINE = ("import os; (os.environ.get('WORKBENCH_KV_AUTOPATCH', '').strip().lower() in "
        "('1', 'true', 'yes', 'on') or bool(os.environ.get('WORKBENCH_KV_STEP_LOG'))) and "
        "__import__('workbench.adapters.boot', fromlist=['install']).install()\n")


def path() -> Path:
    return Path(sysconfig.get_paths()["purelib"]) / NAME


def install() -> Path:
    p = path()
    return write_text(p, LINE, "the .pth file")


def uninstall() -> bool:
    p = path()
    if p.exists():
        p.unlink()
        return True
    return False


def installed() -> bool:
    p = path()
    return p.exists() and p.read_text() == LINE


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "status"
    if cmd == "install":
        print(install())
    elif cmd == "uninstall":
        print("removed" if uninstall() else "not installed")
    elif cmd == "status":
        print(f"{path()}: {'installed' if installed() else 'missing'}")
    else:
        print("usage: python -m workbench.adapters.pth install|uninstall|status")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
