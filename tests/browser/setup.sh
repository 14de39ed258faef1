#!/usr/bin/env bash
# Install what the real-browser test needs; idempotent and fast when everything is present.
#   - Debian's chromium (/usr/bin/chromium), via apt-get (root, as in CI);
#   - playwright-core from npm into tests/browser/node_modules (it never downloads browsers);
#   - JupyterLab 4 into the project venv (also in pyproject's dev extras).
# Usage: tests/browser/setup.sh [VENV]   (VENV defaults to .venv at the repository root)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${1:-$root/.venv}"

if ! command -v chromium >/dev/null 2>&1; then
    echo "[browser setup] installing chromium"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq chromium >/dev/null
fi

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "[browser setup] installing nodejs and npm"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq nodejs npm >/dev/null
fi

want="$(sed -n 's/.*"playwright-core": *"\([^"]*\)".*/\1/p' "$here/package.json")"
have="$(node -p "require('$here/node_modules/playwright-core/package.json').version" 2>/dev/null || true)"
if [ "$have" != "$want" ]; then
    echo "[browser setup] installing playwright-core $want"
    (cd "$here" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --no-audit --no-fund --silent)
fi

if ! "$venv/bin/python" -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('jupyterlab') and u.find_spec('anywidget')))"; then
    echo "[browser setup] installing jupyterlab into $venv"
    "$venv/bin/python" -m pip install -q "jupyterlab>=4.4,<5" "anywidget>=0.9"
fi
echo "[browser setup] ready: $(chromium --version 2>/dev/null | head -n1), playwright-core $want"
