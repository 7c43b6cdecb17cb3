#!/usr/bin/env bash
# Sourced by the gpu/*/prepare.sh scripts (run here, not on the device): wheels for the device
# image's interpreter (CPython 3.12, x86_64 manylinux), by package name, with pip's own index
# settings. `fetch DIR SPEC...` downloads SPEC... without their dependencies into DIR.
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp)
for n in 17 24 27 28 31 34 35; do PLAT+=(--platform "manylinux_2_${n}_x86_64"); done
PLAT+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
fetch() { python3 -m pip download -q --no-deps "${PLAT[@]}" -d "$1" "${@:2}"; }
# what the labs' reports import (workbench.viz draws with plotly) that the device image lacks
LAB_WHEELS=(plotly==7.1.0 narwhals==2.29.0)
