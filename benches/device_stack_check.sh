#!/usr/bin/env bash
# Without a GPU: run the tests that depend on torch, triton and transformers under the versions the
# H200 image has (KINDS.md: torch 2.11, triton 3.6, transformers 5.17), so a version difference
# shows up here and not in the one short device run. Kernels run interpreted, and are compiled for
# sm_80..sm_90 by triton 3.6's own ptxas. The venv (about 5 GB: PyPI's torch 2.11 is a CUDA build)
# goes to $STACK_VENV, default /tmp/lmnb-device-stack, and is reused.
#     bash benches/device_stack_check.sh                # then read the two summaries it prints
set -uo pipefail
cd "$(dirname "$0")/.."
VENV="${STACK_VENV:-/tmp/lmnb-device-stack}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV" || exit 1
  # numpy < 2.4: triton 3.6's interpreter converts arrays to ints the way numpy 2.4 refuses
  "$VENV/bin/pip" install -q "torch==2.11.0" "triton==3.6.0" "transformers==5.17.0" "numpy<2.4" || exit 1
  "$VENV/bin/python" - <<'EOF' > "$VENV/lmnb-reqs.txt" || exit 1
import tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(p["dependencies"] + p["optional-dependencies"]["dev"]))
EOF
  "$VENV/bin/pip" install -q -r "$VENV/lmnb-reqs.txt" "torch==2.11.0" "triton==3.6.0" "transformers==5.17.0" "numpy<2.4" \
    || exit 1
fi
# lmnb itself, editable and without dependencies: its tests read what only an installed package has
# (the nbconvert.exporters entry point, the `lmnb` command, importlib.metadata's version). Done on
# every run, so the metadata is this checkout's. setuptools: pyproject needs >= 77, torch 2.11 < 82.
"$VENV/bin/pip" install -q "setuptools>=77,<82" \
  && "$VENV/bin/pip" install -q --no-deps --no-build-isolation -e . || exit 1
export PYTHONPATH="$PWD" PATH="$VENV/bin:$PATH"
"$VENV/bin/python" -m lmnb_kernel.cli install-kernel --sys-prefix > /dev/null || exit 1
"$VENV/bin/python" -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
# the real-browser test needs the project's own setup (tests/browser/setup.sh); it tests no GPU code
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests --ignore=tests/browser 2>&1 | tail -25
