"""The web page in a real browser (headless Chromium, selenium; tests/browser.py): a person's path
through it, checked on what the browser drew, and the API docs working with no network.

The service runs the tiny random model with a stub decoder that answers the values written in the
document (with set confidences), so that every field is grounded to real OCR words and the test is
fast; the page image and the boxes still come from the live service (OCR, grounding, rendering).
Screenshots go to `artifacts/` (or $PIPKIE_ARTIFACTS).
"""

from __future__ import annotations

import json
import math
import time

import httpx
import pytest

from pipkie.decoding.results import FieldResult
from pipkie.model.groups import ItemsResult
from pipkie.serve import create_app
from tests.browser import ARTIFACTS, LiveServer, chrome, require_browser
from tests.test_extract import KEYS, SAMPLE, tiny_extractor, tiny_model_dir  # noqa: F401
from tests.test_loaders import make_text_pdf

# what the stub decoder answers when the value is in the document, with its confidence
ANSWERS = {
    "company": [("PETRODELI ENTERPRISE", 0.9951), ("ACME TRADING", 0.96)],
    "date": [("26/02/18", 0.95)],
    "address": [("LOT 485 TMN LEMBAH KERAMAT JLN ULU KELANG 54200 KUALA LUMPUR", 0.7999)],
    "total": [("85.54", 0.8), ("9.90", 0.9)],
}  # 99 %, 95 %, 79 % (low), 80 % (not low)
ITEMS = [{"name": "FUELSAVE 95", "price": "85.54"}, {"name": "RELIEF GST", "price": "0.00"}]  # lines on SAMPLE
MAX_UPLOAD_MB = 2


def reading(answers):
    """A stand-in for pip_decode: per key the first of its answers that the document contains."""

    def decode(model, builder, texts, schemas, **kw):
        out = []
        for text, schema in zip(texts, schemas):
            text, row = " ".join(text.split()), {}  # an address runs over several lines
            for key in schema.names:
                value, conf = next(((v, c) for v, c in answers.get(key, []) if v.upper() in text.upper()), (None, 0.2))
                row[key] = FieldResult(value, conf)
            for g in schema.groups:  # lists: the ITEMS lines the document contains
                found = [it for it in ITEMS if all(v.upper() in text.upper() for v in it.values())]
                row[g.name] = ItemsResult(
                    [{f: FieldResult(it.get(f), 0.9 if f in it else 0.2) for f in g.names} for it in found], 0.9
                )
            out.append(row)
        return out

    return decode


@pytest.fixture(scope="module")
def site(tiny_extractor):
    binary, driver = require_browser()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("pipkie.decoding.pip.pip_decode", reading(ANSWERS))
        # a deadline far above the default 15 s: these tests are about the page, and on a busy machine
        # the service's own estimate of a photo's OCR can pass 15 s and answer 503 (deadlines: test_serve_limits)
        app = create_app(tiny_extractor, max_upload_mb=MAX_UPLOAD_MB, request_timeout_s=120)
        with LiveServer(app) as server:
            yield server, binary, driver


@pytest.fixture
def browser(site, tmp_path):
    _, binary, driver = site
    b = chrome(binary, driver, tmp_path)
    b.download_dir = tmp_path
    yield b
    b.quit()


def url(site, path="/"):
    return site[0].url + path


def wait(browser, condition, timeout=60.0, what="the page"):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(
        browser, timeout, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)
    ).until(lambda b: condition(b), f"waiting for {what}")


def state(browser) -> str:
    return browser.find_element("tag name", "body").get_attribute("data-state")


def open_page(browser, site):
    browser.get(url(site))
    wait(browser, lambda b: "pipkie-tiny-model" in b.find_element("id", "model").text, 30, "GET /health")


def upload(browser, path) -> None:
    browser.find_element("id", "file").send_keys(str(path))
    wait(browser, lambda b: state(b) in ("done", "error"), 90, f"the answer for {path.name}")


def rows(browser):
    return browser.find_elements("css selector", "#fields tbody tr")


def drawn_keys(browser) -> list[str]:
    """The field of each box drawn on the page, read at once (the overlay is redrawn as pages load)."""
    return browser.execute_script("return [...document.querySelectorAll('#overlay rect')].map(r => r.dataset.key)")


def rects(browser, key=None):
    sel = "#overlay rect" + (f'[data-key="{key}"]' if key else "")
    return browser.find_elements("css selector", sel)


def css(browser, element, prop: str) -> str:
    """The computed style, as the browser writes it (selenium's own rewrites colours)."""
    return browser.execute_script("return getComputedStyle(arguments[0])[arguments[1]]", element, prop)


def severe_console_errors(browser) -> list[str]:
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def resources(browser) -> list[str]:
    return browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")


def downloaded(directory, name, timeout=20.0) -> dict:
    path = directory / name
    end = time.monotonic() + timeout
    while not path.exists() or list(directory.glob("*.crdownload")):
        assert time.monotonic() < end, f"no {name} downloaded: {sorted(p.name for p in directory.iterdir())}"
        time.sleep(0.1)
    return json.loads(path.read_text())


def service_answer(site, path, content_type, **data) -> httpx.Response:
    with open(path, "rb") as f:
        return httpx.post(url(site, "/extract"), files={"file": (path.name, f, content_type)}, data=data, timeout=60)


def test_drop_a_receipt_see_its_fields_fix_one_download_the_json(site, browser):
    from selenium.webdriver import ActionChains

    open_page(browser, site)
    upload(browser, SAMPLE)
    assert state(browser) == "done", browser.find_element("id", "error").text
    expected = service_answer(site, SAMPLE, "image/jpeg").json()  # the stub makes it the page's answer too
    assert all(expected["fields"][k]["boxes"] for k in KEYS)  # every field is grounded on the receipt

    # the page image is the receipt as read (664 x 1664, shown at most 1600 px high)
    img = browser.find_element("id", "page-image")
    natural = browser.execute_script("return [arguments[0].naturalWidth, arguments[0].naturalHeight]", img)
    assert natural[1] == 1600 and abs(natural[0] / natural[1] - 664 / 1664) < 0.01
    assert browser.find_element("id", "pager").is_displayed() is False

    # the table: key, value, confidence, the low one marked
    table = rows(browser)
    assert [r.get_attribute("data-key") for r in table] == KEYS
    colours = {}
    for row in table:
        key = row.get_attribute("data-key")
        field = expected["fields"][key]
        assert row.find_element("css selector", ".value").get_attribute("value") == field["value"]
        assert (
            row.find_element("css selector", ".pct").text == f"{math.floor(round(field['confidence'] * 1e4) / 100)} %"
        )
        assert ("low" in row.get_attribute("class").split()) == (key == "address")
        assert len(row.find_elements("css selector", ".badge.low")) == (key == "address")
        colours[key] = css(browser, row.find_element("css selector", ".swatch"), "backgroundColor")
    assert len(set(colours.values())) == 4

    # each field's boxes drawn in its colour, where its words are on the image
    box = img.rect
    for key in KEYS:
        drawn, boxes = rects(browser, key), expected["fields"][key]["boxes"]
        assert len(drawn) == len(boxes) > 0, key
        for r, b in zip(drawn, boxes):
            assert css(browser, r, "fill") == colours[key]  # e.g. rgb(230, 25, 75), as its row's swatch
            at = r.rect
            assert abs((at["x"] - box["x"]) / box["width"] - b["x0"]) < 0.01, (key, at, b)
            assert abs((at["y"] - box["y"]) / box["height"] - b["y0"]) < 0.01, (key, at, b)
            assert abs(at["width"] / box["width"] - (b["x1"] - b["x0"])) < 0.01, (key, at, b)

    # hover a row: its boxes stand out, the others fade
    total_row = next(r for r in table if r.get_attribute("data-key") == "total")
    ActionChains(browser).move_to_element(total_row).perform()
    wait(browser, lambda b: "focus" in b.find_element("id", "overlay").get_attribute("class"), 5, "the hover")
    assert {r.get_attribute("data-key") for r in rects(browser) if "hl" in (r.get_attribute("class") or "")} == {
        "total"
    }

    # edit the total (the model's 85.54), then hover the company for the screenshot
    value = total_row.find_element("css selector", ".value")
    value.clear()
    value.send_keys("85.50")
    assert "edited" in total_row.get_attribute("class").split()
    assert total_row.find_element("css selector", ".badge.edited").is_displayed()
    company_row = next(r for r in table if r.get_attribute("data-key") == "company")
    ActionChains(browser).move_to_element(company_row).perform()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "web-page.png"))

    # download: the service's JSON with the edit, edited fields flagged
    browser.find_element("id", "download").click()
    got = downloaded(browser.download_dir, "receipt.json")
    assert got["fields"]["total"] == {
        **expected["fields"]["total"],
        "value": "85.50",
        "edited": True,
        "model_value": "85.54",
    }
    for key in ("company", "date", "address"):
        assert got["fields"][key] == {**expected["fields"][key], "edited": False}
    assert {**got, "fields": None, "seconds": 0} == {**expected, "fields": None, "seconds": 0}

    # undo brings the model's value back
    total_row.find_element("css selector", ".undo").click()
    assert value.get_attribute("value") == "85.54" and "edited" not in total_row.get_attribute("class").split()
    assert severe_console_errors(browser) == []


def test_a_multi_page_pdf_pages_through(site, browser, tmp_path):
    pdf = tmp_path / "invoice.pdf"
    pdf.write_bytes(
        make_text_pdf(
            [
                [(72, 720, 18, "ACME TRADING"), (72, 690, 11, "Invoice 4711")],
                [(72, 500, 11, "Items 3"), (72, 300, 14, "TOTAL 9.90")],
            ]
        )
    )
    open_page(browser, site)
    browser.find_element("id", "keys").send_keys("company, total")
    upload(browser, pdf)
    assert state(browser) == "done", browser.find_element("id", "error").text
    assert [r.get_attribute("data-key") for r in rows(browser)] == ["company", "total"]
    assert browser.find_element("id", "pageinfo").text == "page 1 of 2"
    assert drawn_keys(browser) == ["company", "company"]  # ACME, TRADING
    total_place = browser.find_element("css selector", 'tr[data-key="total"] .where').text
    assert total_place == "1 word, page 2"
    first = browser.find_element("id", "page-image").get_attribute("src")

    browser.find_element("id", "next").click()
    wait(browser, lambda b: b.find_element("id", "pageinfo").text == "page 2 of 2", 30, "page 2")
    wait(browser, lambda b: drawn_keys(b) == ["total"], 30, "page 2's boxes")
    assert browser.find_element("id", "page-image").get_attribute("src") != first
    y = float(rects(browser, "total")[0].get_attribute("y"))
    assert 0.55 < y < 0.65  # 300 pt from the bottom of a 792 pt page
    assert browser.find_element("id", "next").is_enabled() is False

    browser.find_element("id", "prev").click()
    wait(browser, lambda b: drawn_keys(b) == ["company"] * 2, 30, "page 1 again")


DROP = """
const [name, text] = arguments;
const data = new DataTransfer();
data.items.add(new File([text], name, {type: "application/json"}));
document.getElementById("drop").dispatchEvent(new DragEvent("drop", {dataTransfer: data, bubbles: true}));
"""


def test_json_words_dropped_on_the_box(site, browser):
    """Dropping a file reads it once; JSON words are drawn on a page of their own (POST /render)."""
    from selenium.webdriver import ActionChains

    words = {
        "words": [
            {"text": "ACME", "box": [100, 50, 300, 80]},
            {"text": "TRADING", "box": [320, 50, 560, 80]},
            {"text": "TOTAL", "box": [100, 800, 220, 830]},
            {"text": "9.90", "box": [700, 800, 800, 830]},
        ],
        "page_sizes": [[1000, 1400]],
        "normalized": True,
        "id": "words",
    }
    open_page(browser, site)
    browser.execute_script(DROP, "words.json", json.dumps(words))
    wait(browser, lambda b: state(b) in ("done", "error"), 60, "the dropped file's answer")
    assert state(browser) == "done", browser.find_element("id", "error").text
    assert browser.find_element("id", "filename").text.startswith("words.json")
    assert [r.get_attribute("data-key") for r in rows(browser)] == KEYS
    assert drawn_keys(browser) == ["company", "company", "total"]
    total = rects(browser, "total")[0]
    assert [round(float(total.get_attribute(a)), 3) for a in ("x", "y", "width")] == [0.7, 0.8, 0.1]
    natural = browser.execute_script(
        "const i = document.getElementById('page-image');return [i.naturalWidth, i.naturalHeight]"
    )
    assert abs(natural[0] / natural[1] - 1000 / 1400) < 0.01
    ActionChains(browser).move_to_element(total).perform()  # a box lights up its row
    wait(
        browser,
        lambda b: "hl" in b.find_element("css selector", 'tr[data-key="total"]').get_attribute("class"),
        5,
        "the row of the hovered box",
    )
    sent = [r for r in resources(browser) if r.endswith(("/extract", "/render"))]
    assert sorted(r.rsplit("/", 1)[1] for r in sent) == ["extract", "render"]  # one of each: read once


def test_service_errors_are_shown_as_the_service_words_them(site, browser, tmp_path):
    fake = tmp_path / "scan.pdf"
    fake.write_bytes(b"this is not a PDF")
    big = tmp_path / "big.txt"
    big.write_bytes(b"Total 9.90\n" * (MAX_UPLOAD_MB * 2**20 // 11 + 1000))
    open_page(browser, site)
    for path, status, code in ((fake, 422, "unreadable_document"), (big, 413, "body_too_large")):
        answer = service_answer(site, path, "application/octet-stream")
        assert answer.status_code == status and answer.json()["code"] == code, answer.text
        upload(browser, path)
        assert state(browser) == "error"
        assert browser.find_element("id", "error-status").text == str(status)
        assert browser.find_element("id", "error-code").text == code
        assert browser.find_element("id", "error-detail").text == answer.json()["detail"]
        assert browser.find_element("id", "error-id").text.startswith("request id ")
        assert not browser.find_element("id", "results").is_displayed()


def test_the_pages_load_with_the_network_off(site, browser):
    """The browser resolves no host but the service's: every page must come whole from the service."""
    open_page(browser, site)
    browser.get(url(site, "/docs"))
    wait(
        browser, lambda b: "pipkie" in b.find_element("css selector", ".swagger-ui .info .title").text, 30, "Swagger UI"
    )
    paths = {e.text.replace("\u200b", "") for e in browser.find_elements("css selector", ".opblock-summary-path")}
    assert {"/extract", "/render", "/health", "/metrics"} <= paths
    docs_resources = resources(browser)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "web-docs.png"))
    assert any("/docs-assets/swagger-ui-bundle.js" in r for r in docs_resources)
    for r in docs_resources:
        assert r.startswith((site[0].url + "/", "data:", "blob:")), r
    assert severe_console_errors(browser) == []


def test_a_list_of_items_one_row_per_field_one_colour_per_item(site, browser, tmp_path):
    open_page(browser, site)
    browser.find_element("id", "keys").send_keys("total, items[name,price]")
    upload(browser, SAMPLE)
    assert state(browser) == "done", browser.find_element("id", "error").text
    table = rows(browser)
    names = ["total", "items 1 name", "items 1 price", "items 2 name", "items 2 price"]
    assert [r.get_attribute("data-key") for r in table] == names
    values = [r.find_element("css selector", ".value").get_attribute("value") for r in table]
    assert values == ["85.54", "FUELSAVE 95", "85.54", "RELIEF GST", "0.00"]
    colour = {
        r.get_attribute("data-key"): css(browser, r.find_element("css selector", ".swatch"), "backgroundColor")
        for r in table
    }
    assert colour["items 1 name"] == colour["items 1 price"] != colour["items 2 name"] == colour["items 2 price"]
    assert colour["total"] not in (colour["items 1 name"], colour["items 2 name"])
    assert (
        rects(browser, "items 1 name")
        and css(browser, rects(browser, "items 1 name")[0], "fill") == colour["items 1 name"]
    )
    # an edited item field is written back into its place in the list
    value = table[3].find_element("css selector", ".value")
    value.clear()
    value.send_keys("GST RELIEF")
    browser.find_element("id", "download").click()
    out = downloaded(browser.download_dir, "receipt.json")
    second = out["fields"]["items"][1]["name"]
    assert second["edited"] is True and second["value"] == "GST RELIEF" and second["model_value"] == "RELIEF GST"
    assert out["fields"]["items"][0]["name"]["edited"] is False and out["fields"]["total"]["edited"] is False
    assert not severe_console_errors(browser)
