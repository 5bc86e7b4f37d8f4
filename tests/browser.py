"""A real browser for the web page's tests (and scripts/web_screenshot.py): Debian's headless
Chromium and its chromedriver, driven by selenium, and a live `pipkie serve` in a thread.

The browser is installed by the project's set-up (`scripts/install.sh` under CI=true or
PIPKIE_BROWSER_TESTS=1). Where it could not be installed there (no apt-get, not root, the
package mirror down), install.sh writes why to `.venv/.browser-unavailable` and the browser tests
skip with that reason; without that file a missing browser skips on a developer's machine (run
`PIPKIE_BROWSER_TESTS=1 bash scripts/install.sh`) and fails under CI=true, where install.sh must
have installed it.

The browser resolves no host name but the service's (`--host-resolver-rules`): a page that
reached for a CDN would fail to load it, as it would offline.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UNAVAILABLE = ROOT / ".venv" / ".browser-unavailable"
ARTIFACTS = Path(os.environ.get("PIPKIE_ARTIFACTS") or ROOT / "artifacts")
BINARIES = {"chromium": ("chromium", "chromium-browser", "google-chrome"), "chromedriver": ("chromedriver",)}


def find_browser() -> tuple[str, str] | None:
    """(chromium, chromedriver) paths, or None when either is missing."""
    found = [next((p for p in (shutil.which(n) for n in names) if p), None) for names in BINARIES.values()]
    return (found[0], found[1]) if all(found) else None


def require_browser(env=os.environ) -> tuple[str, str]:
    """The browser, else skip (it could not be installed, or not under CI) or fail (CI=true)."""
    pytest.importorskip("selenium", reason="selenium is not installed (the test extra: requirements.lock)")
    found = find_browser()
    if found:
        return found
    if UNAVAILABLE.exists():
        pytest.skip(f"no browser: scripts/install.sh could not install one ({UNAVAILABLE.read_text().strip()})")
    if env.get("CI", "").strip().lower() in ("1", "true", "yes"):
        pytest.fail("chromium and chromedriver are missing: under CI=true scripts/install.sh installs them")
    pytest.skip("chromium and chromedriver are missing: PIPKIE_BROWSER_TESTS=1 bash scripts/install.sh installs them")


def chrome(binary: str, driver: str, download_dir: Path, size: tuple[int, int] = (1440, 1000)):
    """Headless Chromium (selenium) that downloads into `download_dir` and logs the console."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # selenium must not try to fetch a driver of its own
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--window-size={size[0]},{size[1]}",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--disable-background-networking",
        "--no-first-run",
        "--lang=en-US",
    ):
        opts.add_argument(arg)
    opts.add_experimental_option(
        "prefs", {"download.default_directory": str(download_dir), "download.prompt_for_download": False}
    )
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(options=opts, service=Service(executable_path=driver))
    browser.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(download_dir)})
    return browser


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """`app` served by uvicorn on 127.0.0.1 in a thread, for a browser to reach."""

    def __init__(self, app):
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        end = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > end:
                raise RuntimeError("the test server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
