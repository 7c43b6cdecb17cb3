#!/usr/bin/env bash
# Builds the folder `make test-gpu` needs on the device: the project's dependencies that the
# device image (torch, numpy, pytest, hypothesis, cuda-bindings) lacks, from package names.
#   bash gpu/tests/prepare.sh DEST        (DEST: an ignored folder of the checkout, 16 MB)
# Then on the device, from the checkout root, with DEST carried:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site DEST/*.whl
#   PYTHONPATH=/tmp/site make test-gpu PYTHON=python3
set -euo pipefail
DEST="${1:?usage: prepare.sh DEST}"
mkdir -p "$DEST"
source "$(dirname "${BASH_SOURCE[0]}")/../fetch.sh"
fetch "$DEST" simpy==4.1.2 typer==0.29.2 click==8.5.1 shellingham==1.5.4 rich==15.0.0 \
  markdown-it-py==4.3.0 mdurl==0.1.2 pygments==2.21.0 pydantic==2.14.4 pydantic-core==2.50.5 \
  annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 \
  fastapi==0.165.0 starlette==1.10.0 annotated-doc==0.0.7 uvicorn==0.54.0 h11==0.16.0 \
  prometheus-client==0.26.0 httpx==0.28.1 httpcore==1.0.9 anyio==4.16.0 idna==3.20 \
  certifi==2026.10.19.post1 httpx-sse==0.4.3 psutil==7.2.2 platformdirs==4.14.9 \
  opentelemetry-api==1.45.3 pytest-timeout==2.4.0 "${LAB_WHEELS[@]}"
du -sh "$DEST"
