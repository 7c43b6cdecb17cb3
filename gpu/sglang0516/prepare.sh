#!/usr/bin/env bash
# Builds the folder a GPU run of SGLang 0.5.16 needs (the release pinned to torch 2.11, the
# device image's torch), from package names, with pip's own index settings.
#   bash gpu/sglang0516/prepare.sh DEST        (DEST: an ignored folder of the checkout)
# Then on the device, from the checkout root: bash gpu/sglang0516/serve.sh DEST CODE OUT
# sglang-kernel 0.4.5 is 383 MB, almost all of it FlashAttention and sm100 builds: only its
# Python files and the sm90 op library travel (the server runs Triton attention on Hopper).
# flashinfer travels as its Python files alone (SGLang imports its sampling module on CUDA;
# the pytorch sampling backend never calls it). xgrammar (45 MB) does not travel: the server
# imports one name of it at start-up and runs with --grammar-backend none (xgrammar_stub.py).
set -euo pipefail
DEST="${1:?usage: prepare.sh DEST}"
mkdir -p "$DEST/wheels" "$DEST/tmp"
DEST="$(cd "$DEST" && pwd)"
source "$(dirname "${BASH_SOURCE[0]}")/../fetch.sh"
fetch "$DEST/wheels" "${LAB_WHEELS[@]}"
# what SGLang 0.5.16's server imports that the device image lacks (found by tracing the
# server's imports in a CPU venv), the project's settings, and simpy; tokenizers because
# transformers 5.12.1 refuses the image's 0.23.2 at import (it wants <= 0.23.0)
fetch "$DEST/wheels" annotated-types==0.8.0 apache-tvm-ffi==0.1.11 \
  compressed-tensors==0.20.1 dill==0.4.1 distro==1.9.0 fastapi==0.136.3 starlette==1.0.1 \
  gguf==0.18.0 loguru==0.7.3 msgspec==0.23.0 openai==2.6.1 jiter==0.19.0 sniffio==1.3.1 \
  orjson==3.11.5 partial-json-parser==0.2.1.1.post7 pybase64==1.5.1 pydantic==2.14.4 \
  pydantic-core==2.50.5 typing-inspection==0.4.5 python-multipart==0.0.20 pyzmq==27.3.0 \
  setproctitle==1.3.7 soundfile==0.13.1 cffi==2.0.0 pycparser==2.23 uvicorn==0.54.0 \
  watchfiles==1.3.0 zstandard==0.25.0 jsonschema==4.25.1 \
  jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==0.30.0 \
  opentelemetry-api==1.39.1 importlib-metadata==8.7.1 ipython==9.8.0 traitlets==5.14.3 \
  ipython-pygments-lexers==1.1.1 asttokens==3.0.2 decorator==5.2.1 executing==2.3.0 \
  jedi==0.19.2 parso==0.8.5 matplotlib-inline==0.2.1 pexpect==4.9.0 ptyprocess==0.7.0 \
  prompt-toolkit==3.0.52 wcwidth==0.2.14 pure-eval==0.2.3 stack-data==0.6.3 tabulate==0.9.0 \
  pydantic-settings==2.16.3 python-dotenv==1.2.4 simpy==4.1.2 \
  tokenizers==0.22.2
# sglang and transformers travel as xz'd trees (64 MiB a call): SGLang 0.5.16 needs its pinned
# transformers 5.12.1, the image's 5.17 already registers a config SGLang registers again
# ("'qwen3_asr' is already used by a Transformers config")
fetch "$DEST/tmp" sglang==0.5.16 transformers==5.12.1 sglang-kernel==0.4.5 flashinfer-python==0.6.14
python3 - "$DEST" <<'PY'
import glob, io, sys, tarfile, zipfile
dest = sys.argv[1]

def pack(tar_name, whl_glob, keep, preset=6):
    whl = zipfile.ZipFile(glob.glob(f"{dest}/tmp/{whl_glob}")[0])
    with tarfile.open(f"{dest}/{tar_name}", "w:xz", preset=preset) as tar:
        for info in whl.infolist():
            if info.filename.endswith("/") or not keep(info.filename):
                continue
            data = whl.read(info)
            ti = tarfile.TarInfo(info.filename)
            ti.size, ti.mode = len(data), 0o755 if ".so" in info.filename else 0o644
            tar.addfile(ti, io.BytesIO(data))

pack("sgl_kernel.tar.xz", "sglang_kernel-0.4.5-*.whl", lambda n: n.endswith(".py") or n in (
    "sgl_kernel/sm90/common_ops.abi3.so", "sgl_kernel/spatial_ops.abi3.so")
    or (n.startswith("sglang_kernel-0.4.5.dist-info/") and not n.endswith("RECORD")), preset=9)
pack("sglang.tar.xz", "sglang-0.5.16-*.whl", lambda n: not n.endswith("RECORD"))
pack("transformers.tar.xz", "transformers-5.12.1-*.whl", lambda n: not n.endswith("RECORD"))
pack("flashinfer.tar.xz", "flashinfer_python-0.6.14-*.whl", lambda n: n.endswith(".py") or (
    n.startswith("flashinfer_python-0.6.14.dist-info/") and not n.endswith("RECORD")))
PY
rm -rf "$DEST/tmp"
du -sh "$DEST"
