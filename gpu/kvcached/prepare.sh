#!/usr/bin/env bash
# Builds the folder that brings kvcached 0.1.6 to the GPU machine (no network there): its sdist,
# to be compiled there against the image's torch 2.11 and CUDA toolchain (env.sh); the one
# Python dependency the image lacks (posix_ipc, for kvctl; numpy, wrapt and packaging are there);
# and a setuptools new enough to read its pyproject (a licence string needs setuptools >= 77,
# whatever the image's is), used for the build only.
#   bash gpu/kvcached/prepare.sh DEST   (DEST: an ignored folder of the checkout, ~0.5 MB)
# Then on the device, after gpu/vllm26/env.sh: KVC=DEST source gpu/kvcached/env.sh
set -euo pipefail
DEST="${1:?usage: prepare.sh DEST}"
mkdir -p "$DEST/wheels"
DEST="$(cd "$DEST" && pwd)"
source "$(dirname "${BASH_SOURCE[0]}")/../fetch.sh"
fetch "$DEST/wheels" posix_ipc==1.3.2
mkdir -p "$DEST/build"
fetch "$DEST/build" setuptools==80.9.0
# pip reads an sdist's metadata before it keeps the file, and kvcached's setup.py refuses to run
# without a CUDA torch >= 2.10. A torch that only answers setup.py's questions (version, CUDA,
# the extension classes) lets pip read it here; nothing is built, and the device builds against
# its real torch.
SHIM="$(mktemp -d)"
trap 'rm -rf "$SHIM"' EXIT
python3 -m pip install -q --no-deps --no-index --target "$SHIM" "$DEST"/build/setuptools-*.whl
mkdir -p "$SHIM/torch/utils"
cat > "$SHIM/torch/__init__.py" <<'PY'
__version__ = "2.11.0"
class version:
    cuda, hip = "13.0", None
class _C:
    _GLIBCXX_USE_CXX11_ABI = True
PY
: > "$SHIM/torch/utils/__init__.py"
cat > "$SHIM/torch/utils/cpp_extension.py" <<'PY'
from setuptools import Extension
from setuptools.command.build_ext import build_ext as BuildExtension
def CppExtension(name, sources, **kw):
    return Extension(name, sources)
CUDAExtension = CppExtension
def include_paths(*a, **k):
    return []
def library_paths(*a, **k):
    return []
PY
PYTHONPATH="$SHIM" python3 -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
  -d "$DEST" kvcached==0.1.6
python3 - "$DEST/kvcached-0.1.6.tar.gz" <<'PY'
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    names = t.getnames()
need = ["kvcached-0.1.6/setup.py", "kvcached-0.1.6/kvcached_autopatch.pth",
        "kvcached-0.1.6/kvcached/integration/vllm/patches.py"]
missing = [n for n in need if n not in names]
assert not missing, f"kvcached sdist lacks {missing}"
print(f"kvcached 0.1.6 sdist: {len(names)} entries, {sum(n.endswith('.cpp') for n in names)} C++ sources")
PY
du -sh "$DEST"
