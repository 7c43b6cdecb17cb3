#!/usr/bin/env bash
# Fetch (here, with network) the wheels the SGLang GPU tests need on a bare GPU box whose image has
# Python 3.12, torch and cuda-python but no network: SGLang 0.5.23 without its kernel wheel
# (tests/engines_real/sglang/shim stands in for sgl_kernel's imports) and the small pure-Python
# packages its mem_cache imports pull in, plus pytest and the workbench CLI's. About 59 MB.
# usage: bash tests/engines_real/sglang/gpu_wheels.sh DIR
set -eu
DIR=${1:?usage: gpu_wheels.sh DIR}
mkdir -p "$DIR"
PLAT="--platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  $PLAT -d "$DIR" sglang==0.5.23 apache-tvm-ffi==0.1.11 compressed-tensors==0.18.0 \
  annotated-types asttokens decorator dill executing frozendict gguf ipython \
  ipython-pygments-lexers jedi loguru matplotlib-inline msgspec orjson parso pexpect \
  prompt-toolkit ptyprocess pure-eval pybase64 pydantic pydantic-core pyzmq stack-data \
  starlette traitlets typing-inspection wcwidth simpy openai partial-json-parser einops distro \
  jiter httpx httpcore anyio sniffio h11 typer rich markdown-it-py mdurl click shellingham \
  pygments pytest pluggy iniconfig annotated-doc typing-extensions
du -sh "$DIR"
