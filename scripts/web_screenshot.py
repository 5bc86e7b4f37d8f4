"""A screenshot of the web page reading a document with a real model, for docs/WEB.md.

    .venv/bin/python scripts/web_screenshot.py                      # the shipped model, samples/receipt.jpg
    .venv/bin/python scripts/web_screenshot.py --model DIR --document scan.pdf --hover date --out shot.png
    .venv/bin/python scripts/web_screenshot.py --hover address --edit "address=LOT 485 TMN ..."   # docs/web.png

Serves the model on 127.0.0.1 (a free port), opens `/` in headless Chromium (Debian's chromium and
chromium-driver: `PIPKIE_BROWSER_TESTS=1 bash scripts/install.sh`), drops the document, waits for
the fields, types the `--edit` values, rests the pointer on one row (its boxes highlighted) and
saves the window. Prints the
extracted values and confidences, so the caption can say what the picture shows.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/browser.py: the same browser set-up as the browser test


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model directory (default: the shipped model)")
    p.add_argument("--document", default=str(ROOT / "samples" / "receipt.jpg"))
    p.add_argument("--hover", default="total", help="the field whose row the pointer rests on")
    p.add_argument("--edit", action="append", default=[], metavar="KEY=VALUE", help="type this value (repeatable)")
    p.add_argument("--out", default=str(ROOT / "docs" / "web.png"))
    p.add_argument("--size", default="1440x1000", help="window size, WxH")
    args = p.parse_args(argv)

    from selenium.webdriver import ActionChains
    from selenium.webdriver.support.ui import WebDriverWait

    from pipkie.extract import Extractor
    from pipkie.serve import create_app
    from tests.browser import LiveServer, chrome, find_browser

    found = find_browser()
    if not found:
        print("no chromium/chromedriver: PIPKIE_BROWSER_TESTS=1 bash scripts/install.sh", file=sys.stderr)
        return 2
    w, h = (int(v) for v in args.size.split("x"))
    extractor = Extractor.from_pretrained(args.model)
    with LiveServer(create_app(extractor, request_timeout_s=120)) as server, tempfile.TemporaryDirectory() as tmp:
        browser = chrome(*found, Path(tmp), size=(w, h))
        try:
            browser.get(server.url + "/")
            browser.find_element("id", "file").send_keys(str(Path(args.document).resolve()))
            WebDriverWait(browser, 300).until(
                lambda b: b.find_element("tag name", "body").get_attribute("data-state") in ("done", "error")
            )
            if browser.find_element("tag name", "body").get_attribute("data-state") == "error":
                print("the service refused it:", browser.find_element("id", "error").text, file=sys.stderr)
                return 1
            for row in browser.find_elements("css selector", "#fields tbody tr"):
                print(
                    row.get_attribute("data-key"),
                    repr(row.find_element("css selector", ".value").get_attribute("value")),
                    row.find_element("css selector", ".pct").text,
                )
            for edit in args.edit:
                key, _, value = edit.partition("=")
                box = browser.find_element("css selector", f'#fields tbody tr[data-key="{key}"] .value')
                box.clear()
                box.send_keys(value)
            row = browser.find_elements("css selector", f'#fields tbody tr[data-key="{args.hover}"]')
            if row:
                ActionChains(browser).move_to_element(row[0]).perform()
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            browser.save_screenshot(args.out)
            print("saved", args.out)
        finally:
            browser.quit()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
