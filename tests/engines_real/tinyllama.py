"""The tiny random Llama now lives in the package (the ``vllm`` kind's labs build it too)."""

from __future__ import annotations

import sys

from workbench.engines.real.tinymodel import build

__all__ = ["build"]

if __name__ == "__main__":
    print(build(sys.argv[1]))
