#!/usr/bin/env bash
# Builds the folder the GPU run needs (vLLM 0.26.0 for the device's torch 2.11 and what it
# imports that the device image lacks), from package names, with pip's own index settings.
#   bash gpu/vllm26/prepare.sh DEST [OPS]   (DEST, OPS: ignored folders of the checkout)
# OPS gets vLLM's compiled op library alone (xz'd, 56 MB): too big to travel beside DEST, it goes
# in a call of its own first (bash gpu/vllm26/ops.sh OPS, on the device; /tmp keeps it while
# the machine stays warm). Without it env.sh falls back to opstub.py and says so.
# Then on the device, from the checkout root: bash gpu/vllm26/run.sh DEST CODE [pytest args]
set -euo pipefail
DEST="${1:?usage: prepare.sh DEST [OPS]}"
OPS="${2:-}"
mkdir -p "$DEST/wheels" "$DEST/tmp"
DEST="$(cd "$DEST" && pwd)"
source "$(dirname "${BASH_SOURCE[0]}")/../fetch.sh"
fetch "$DEST/wheels" "${LAB_WHEELS[@]}"
# vLLM 0.26.0's start-up imports the device image lacks or holds too old, and simpy
fetch "$DEST/wheels" aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 attrs==26.1.0 \
  cloudpickle==3.1.3 einops==0.8.2 frozenlist==1.8.0 multidict==7.2.1 prometheus-client==0.26.0 \
  propcache==0.5.4 py-cpuinfo==9.0.0 typing-extensions==4.16.0 uvloop==0.23.0 yarl==1.25.1 \
  annotated-doc==0.0.7 annotated-types==0.8.0 apache-tvm-ffi==0.1.10 \
  cachetools==8.0.2 cbor2==6.3.0 distro==1.9.0 fastapi==0.136.3 jiter==0.19.0 \
  llguidance==1.7.6 msgspec==0.23.0 openai==2.54.0 openai-harmony==0.0.8 \
  partial-json-parser==0.2.1.1.post7 pybase64==1.5.1 pydantic==2.14.4 pydantic-core==2.50.5 \
  pyzmq==27.3.0 sniffio==1.3.1 starlette==1.0.1 typing-inspection==0.4.5 xgrammar==0.2.7 \
  simpy==4.1.2
# what the project imports that the image lacks (settings), and vLLM's OpenAI server (uvicorn)
fetch "$DEST/wheels" pydantic-settings==2.16.3 python-dotenv==1.2.4 uvicorn==0.54.0 \
  prometheus-fastapi-instrumentator==8.1.0 model-hosting-container-standards==0.1.16 \
  jmespath==1.1.0 supervisor==4.3.0 watchfiles==1.3.0
fetch "$DEST/tmp" vllm==0.26.0
# vLLM's Python sources and its three small libraries, and FlashAttention 3's library (xz'd:
# vllm.vllm_flash_attn refuses to import without it); the op library only into OPS (the MoE
# and FlashAttention 2 libraries stay behind: vLLM imports both guarded, and a dense Llama on
# Hopper needs neither)
python3 - "$DEST" "$OPS" <<'PY'
import glob, io, lzma, os, sys, tarfile, zipfile
dest, ops = sys.argv[1], sys.argv[2]
whl = zipfile.ZipFile(glob.glob(f"{dest}/tmp/vllm-0.26.0-*.whl")[0])
small = {"vllm/spinloop.abi3.so", "vllm/fs_io_C.abi3.so", "vllm/_rust_tool_parser.abi3.so"}
skip = ("vllm/third_party/deep_gemm/", "vllm/third_party/fmha_sm100/", "vllm/vllm-rs")
with tarfile.open(f"{dest}/vllm_py.tar.xz", "w:xz") as tar:
    for info in whl.infolist():
        n = info.filename
        keep = (n.startswith("vllm/") and not n.startswith(skip) and not n.endswith("/")
                and (n.endswith(".py") or n in small or not (".so" in n or n.endswith(".cpp")))
                ) or (n.startswith("vllm-0.26.0.dist-info/") and not n.endswith("RECORD"))
        if keep:
            data = whl.read(info)
            ti = tarfile.TarInfo(n)
            ti.size, ti.mode = len(data), 0o644
            tar.addfile(ti, io.BytesIO(data))
fa3 = "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"
with tarfile.open(f"{dest}/fa3.tar.xz", "w:xz", preset=9) as tar:
    data = whl.read(fa3)
    ti = tarfile.TarInfo(fa3)
    ti.size, ti.mode = len(data), 0o755
    tar.addfile(ti, io.BytesIO(data))
if ops:
    os.makedirs(ops, exist_ok=True)
    lib = "vllm/_C_stable_libtorch.abi3.so"
    with lzma.open(f"{ops}/{os.path.basename(lib)}.xz", "wb", preset=9) as f:
        f.write(whl.read(lib))
PY
rm -rf "$DEST/tmp"
du -sh "$DEST" ${OPS:+"$OPS"}
