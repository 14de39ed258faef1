#!/usr/bin/env bash
# Download, on the workstation, the wheels the device machine lacks for the benchmarks (its image
# has torch, triton and transformers but not outlines-core) into .whl/ (git-ignored), for
# Python 3.12 on x86-64 Linux as /work/.library/device/README.md describes. gpu_check.sh installs them.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "outlines-core==0.2.14"
ls -la .whl
