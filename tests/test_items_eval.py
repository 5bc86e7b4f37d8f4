"""Line items end to end: item metrics, WildReceipt's items, gold items, `pipkie evaluate | extract |
bench --lines` on tiny random models (their answers are random: structure is checked, and grounding
and drawing with a stand-in decoder that answers known items)."""

import json
import math

import pytest
from PIL import Image
from typer.testing import CliRunner

from pipkie.cli import app
from pipkie.data.wildreceipt import items_of, read_wildreceipt
from pipkie.decoding.results import FieldResult
from pipkie.eval.gold import gold_items
from pipkie.eval.metrics import ItemScores, match_items
from pipkie.io.document import Document, Word
from pipkie.io.grounding import PALETTE
from pipkie.model.groups import ItemsResult
from pipkie.schema import Group, Key, KeySchema
from tests.test_extract import tiny_extractor, tiny_model_dir  # noqa: F401  (session fixtures)

runner = CliRunner()
WR_DEV = "wildreceipt_dev"


def run(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


# ---- metrics -----------------------------------------------------------------------------------
def test_item_scores_known_answers():
    gold = [{"name": "Burger", "price": "9.00"}, {"name": "Coke", "price": "2.50"}, {"name": "Fries", "price": "3.50"}]
    pred = [
        {"name": "Coke", "price": "2.00"},
        {"name": "Fries", "price": "3.50"},
        {"name": "Burgr", "price": "9.00"},
        {"name": "Tea", "price": "1.00"},
    ]
    s = ItemScores(("name", "price"))
    assert s.add(pred, gold) == 2  # Fries, and Burgr (name ANLS 5/6 >= 0.8, same price); Coke's price differs
    out = s.summary()
    assert (out["tp"], out["n_pred"], out["n_gold"], out["n_matched"]) == (2, 4, 3, 3)
    assert out["precision"] == pytest.approx(0.5) and out["recall"] == pytest.approx(2 / 3)
    assert out["f1"] == pytest.approx(4 / 7)
    assert out["per_field"]["name"] == pytest.approx((1 + 1 + 5 / 6) / 3)
    assert out["per_field"]["price"] == pytest.approx((0.75 + 1 + 1) / 3)  # 2.00 vs 2.50: one edit in four


def test_item_matching_is_one_to_one_and_prefers_equal_prices():
    gold = [{"name": "Coke", "price": "2.00"}, {"name": "Coke", "price": "2.50"}]
    pred = [{"name": "Coke", "price": "2.50"}, {"name": "Coke", "price": "2.00"}, {"name": "Coke", "price": "2.00"}]
    assert sorted(match_items(pred, gold)) == [(0, 1, 1.0), (1, 0, 1.0)]
    s = ItemScores(("name", "price"))
    assert s.add(pred, gold) == 2 and s.summary()["precision"] == pytest.approx(2 / 3)
    near = ItemScores(("name", "price"))
    assert near.add([{"name": "Brgr", "price": "9"}], [{"name": "Burger", "price": "9"}]) == 0  # ANLS 2/3 < 0.8
    names = ItemScores(("name",))  # no price asked for: the name alone decides
    assert names.add([{"name": "burger"}], [{"name": "Burger"}]) == 1
    nameless = ItemScores(("name", "price"))  # lines without a name pair up by their prices
    pred = [{"name": None, "price": "6,90"}, {"name": None, "price": "1,00"}]
    assert nameless.add(pred, [{"name": None, "price": "1,00"}]) == 1 and nameless.n_matched == 1
    assert match_items(pred, [{"name": None, "price": "1,00"}]) == [(1, 0, 1.0)]
    empty = ItemScores(("name", "price"))
    empty.add([], gold)
    empty.add(None, [])
    assert (
        empty.summary()["recall"] == 0 and empty.summary()["n_docs"] == 2 and empty.summary()["per_field"]["name"] == 0
    )


# ---- WildReceipt and gold items ----------------------------------------------------------------
def _w(text, x, y):
    return Word(text, (x, y, x + 60, y + 20))


def test_wildreceipt_items_one_per_line():
    by_key = {
        "prod_item": [_w("Latte", 100, 100), _w("Soup", 100, 200), _w("Bagel", 100, 500), _w("Tea", 100, 700)],
        "prod_quantity": [_w("2x", 20, 100), _w("1", 20, 400), _w("3", 20, 600)],
        "prod_price": [_w("7,00", 800, 100), _w("4,50", 800, 240), _w("3,00", 800, 400), _w("1,00", 800, 700)],
    }
    # Soup's price is on the next line, which has no name: the same item. "1 … 3,00" follows a priced
    # item: an item of its own without a name. A quantity alone goes with the next line.
    assert items_of(by_key) == [
        {"name": "Latte", "quantity": "2x", "price": "7,00"},
        {"name": "Soup", "quantity": "", "price": "4,50"},
        {"name": "", "quantity": "1", "price": "3,00"},
        {"name": "Bagel", "quantity": "", "price": ""},
        {"name": "Tea", "quantity": "3", "price": "1,00"},
    ]
    assert items_of({}) == []


def test_wildreceipt_dev_maps_products_to_items(shared_data):
    docs = {d.id: d for d in read_wildreceipt(shared_data / WR_DEV, "dev", limit=10)}
    ilio = docs["Image_83_7_f6b397503d69287709ba3872c7e548d45917cd2e"]
    group = Group("items", (Key("name"), Key("quantity"), Key("price")))
    items = gold_items(ilio, group, {})
    assert len(items) == 14 and items[0] == {"name": "LowenbrauOriginal", "quantity": "4x", "price": "12,00"}
    assert items[9] == {"name": None, "quantity": "1x", "price": "6,90"}  # a line whose name was not labelled
    assert ilio.fields["prod_item"][0] == "LowenbrauOriginal"  # the per-class fields stay as they were
    assert gold_items(ilio, Group("lines", (Key("product"),)), {"lines": "items", "lines.product": "items.name"})[
        0
    ] == {"product": "LowenbrauOriginal"}


# ---- evaluate ----------------------------------------------------------------------------------
def test_evaluate_wildreceipt_items(tiny_model_dir, shared_data, tmp_path):  # noqa: F811
    out = tmp_path / "wr.json"
    res = run(
        "evaluate",
        "--dataset",
        "wildreceipt",
        "--data-dir",
        shared_data / WR_DEV,
        "--split",
        "dev",
        "--keys",
        "items[name,quantity,price]",
        "--model",
        tiny_model_dir,
        "--limit",
        "3",
        "--json",
        out,
    )
    assert res.exit_code == 0, res.output
    assert "items: item P" in res.stdout
    result = json.loads(out.read_text())
    docs = list(read_wildreceipt(shared_data / WR_DEV, "dev", limit=3))
    s = result["items"]["items"]
    assert s["n_gold"] == sum(len(d.fields.get("items.name", [])) for d in docs) > 0 and s["n_docs"] == 3
    assert set(s["per_field"]) == {"name", "quantity", "price"} and 0 <= s["f1"] <= 1
    assert result["keys"] == ["items[name,quantity,price]"] and result["fingerprint"]["lists"][0][0] == "items"
    rows = [json.loads(line) for line in out.with_suffix(".predictions.jsonl").read_text().splitlines()]
    assert all(isinstance(r["pred"]["items"], list) and isinstance(r["gold"]["items"], list) for r in rows)
    from pipkie.eval.evaluate import rescore

    assert rescore(out.with_suffix(".predictions.jsonl"))["items"]["items"] == s  # lists found by their shape


# ---- extract -----------------------------------------------------------------------------------
LINES = [("Coke", "2", "2.00", 300), ("Fries", "1", "3.50", 600)]


def _items_words(tmp_path):
    words = [{"text": "CAFE", "box": [100, 50, 300, 80]}]
    for name, qty, price, y in LINES:
        words += [
            {"text": qty, "box": [40, y, 80, y + 30]},
            {"text": name, "box": [100, y, 300, y + 30]},
            {"text": price, "box": [700, y, 800, y + 30]},
        ]
    p = tmp_path / "items.json"
    p.write_text(json.dumps({"words": words, "page_sizes": [[1000, 1000]]}))
    return p


def _answer_items(model, builder, texts, schemas, **kw):
    """A stand-in for pip_decode: the items of LINES (grounding and drawing need real answers)."""
    items = [
        {"name": FieldResult(n, 0.9), "quantity": FieldResult(q, 0.8), "price": FieldResult(p, 0.7)}
        for n, q, p, _ in LINES
    ]
    return [
        {**{k: FieldResult(None, 0.1) for k in s.names}, **{g.name: ItemsResult(items, 0.8, False) for g in s.groups}}
        for s in schemas
    ]


def test_extract_prints_items_with_boxes_and_draws_one_colour_per_item(tiny_model_dir, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr("pipkie.decoding.pip.pip_decode", _answer_items)
    out = tmp_path / "items.png"
    res = run(
        "extract",
        _items_words(tmp_path),
        "--keys",
        "total,items[name,quantity,price]",
        "--model",
        tiny_model_dir,
        "--draw",
        out,
    )
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["fields"]["total"]["value"] is None and "lists_truncated" not in d
    items = d["fields"]["items"]
    assert [{k: f["value"] for k, f in it.items()} for it in items] == [
        {"name": n, "quantity": q, "price": p} for n, q, p, _ in LINES
    ]
    for it, (_, _, _, y) in zip(items, LINES):
        assert all(
            f["grounding"] == "exact" and [round(b["y0"] * 1000) for b in f["boxes"]] == [y] for f in it.values()
        )
    with Image.open(out) as im:
        colours = [im.getpixel((100, y + 15)) for *_, y in LINES]  # the left edge of each name's box
    assert colours == [Image.new("RGB", (1, 1), c).getpixel((0, 0)) for c in PALETTE[:2]]


def test_extract_items_from_a_real_receipt_image(tiny_model_dir):  # noqa: F811
    from tests.test_extract import SAMPLE

    res = run("extract", SAMPLE, "--keys", "items[name,quantity,price]", "--model", tiny_model_dir)
    assert res.exit_code == 0, res.output
    items = json.loads(res.stdout)["fields"]["items"]
    assert isinstance(items, list)
    for it in items:
        assert set(it) == {"name", "quantity", "price"}
        assert all(0 <= f["confidence"] <= 1 and (f["boxes"] == [] or f["value"] is not None) for f in it.values())


def test_bad_item_keys_are_usage_errors(tiny_model_dir, tmp_path):  # noqa: F811
    res = run("extract", _items_words(tmp_path), "--keys", "items[name,price", "--model", tiny_model_dir)
    assert res.exit_code == 2 and "not closed" in res.output


ITEM_SCHEMA = {
    "properties": {
        "total": {"type": "string"},
        "items": {"type": "array", "maxItems": 3, "items": {"$ref": "#/$defs/Item"}},
    },
    "$defs": {"Item": {"type": "object", "properties": {"name": {"type": "string"}, "price": {"type": "string"}}}},
}


def test_the_service_parses_lists_from_keys_and_json_schemas():
    from pipkie.serve.parsing import parse_keys

    ks = parse_keys("total, items[name,quantity,price]", None, 32, ["total"])
    assert ks.names == ["total"] and ks.group_names == ["items"] and ks.groups[0].names == ["name", "quantity", "price"]
    ks = parse_keys(None, ITEM_SCHEMA, 32, ["total"])
    assert ks.groups[0].max_items == 3 and ks.groups[0].names == ["name", "price"]


@pytest.mark.parametrize(
    "keys, schema, fragment",
    [
        ("total, items[name,price", None, "not closed"),
        (None, {"properties": {"items": {"type": "array", "items": "name"}}}, "JSON object"),
        (None, {"properties": {"items": {"type": "array", "items": {"properties": {"n": {"type": {}}}}}}}, "'type'"),
        (None, {"properties": {"total": {"type": "string"}}, "$defs": {"Item": {"properties": []}}}, "'properties'"),
        ("items[a,b,c,d,e,f,g,h,i]", None, "at most 8"),
    ],
)
def test_the_service_answers_bad_lists_422(keys, schema, fragment):
    from pipkie.serve.parsing import ApiError, parse_keys

    with pytest.raises(ApiError, match=fragment) as e:
        parse_keys(keys, schema, 8, ["total"])
    assert e.value.status == 422


def test_the_service_extracts_lists(tiny_extractor):  # noqa: F811
    from fastapi.testclient import TestClient

    from pipkie.serve import create_app

    lines = [f"{q} {name} {price}" for name, q, price, _ in LINES] + ["TOTAL 5.50"]
    words = {"words": [{"text": t, "box": [100, 50 + 30 * i, 300, 70 + 30 * i]} for i, t in enumerate(lines)]}
    with TestClient(create_app(tiny_extractor, max_keys=8)) as client:
        res = client.post("/extract", json={**words, "keys": "total,items[name,price]"})
        assert res.status_code == 200, res.text
        out = res.json()
        assert set(out["fields"]) == {"total", "items"} and isinstance(out["fields"]["items"], list)
        assert len(out["fields"]["items"]) <= 8
        for it in out["fields"]["items"]:
            assert set(it) == {"name", "price"} and all(0 <= f["confidence"] <= 1 for f in it.values())
        res = client.post("/extract", json={**words, "schema": ITEM_SCHEMA})
        assert res.status_code == 200, res.text
        assert len(res.json()["fields"]["items"]) <= 3
        listed = client.get("/openapi.json").json()["components"]["schemas"]["ExtractionOut"]["properties"]
        assert "lists_truncated" in listed and "anyOf" in str(listed["fields"])


# ---- bench --lines -----------------------------------------------------------------------------
def test_bench_lines_sweep_on_a_tiny_model(tiny_model_dir, tmp_path):  # noqa: F811
    import random

    from pipkie.eval.bench_items import items_receipt, lines_bench

    text, items = items_receipt(5, random.Random(0))
    assert len(items) == 5 and all(f"{it['quantity']} {it['name']} {it['price']}" in text.split("\n") for it in items)
    out = tmp_path / "lines.json"
    result = lines_bench(
        model_path=str(tiny_model_dir),
        lines=(1, 3),
        batch_sizes=(1, 2),
        items_budget=4,
        json_path=str(out),
        plot_dir=str(tmp_path / "plots"),
        log=lambda *a: None,
    )
    assert json.loads(out.read_text())["lines"] == result["lines"]
    for bs in ("1", "2"):
        pts = result["lines"][bs]
        assert [p["lines"] for p in pts] == [1, 3] and all(
            p["items_budget"] == 4 and p["batch"] == int(bs) for p in pts
        )
        for p in pts:
            assert all(p[f"{m}_s"] > 0 and 0 <= p[f"{m}_item_f1"] <= 1 for m in ("pip", "ar-forced", "ar-free"))
            assert math.isclose(p["speedup_vs_ar-free"], p["ar-free_s"] / p["pip_s"]) and p["ar_free_steps"] >= 1
    assert (tmp_path / "plots" / "speedup_lines.png").exists() and "| 2 | 3 |" in (
        tmp_path / "plots" / "bench_lines.md"
    ).read_text()
    res = run("bench", "--lines", "1,2", "--lines-items", "2", "--batch", "1", "--model", tiny_model_dir, "--no-sweeps")
    assert res.exit_code == 0, res.output
    assert "| 1 | 2 |" in res.stdout
    assert result["env"]["seed"] == 0
    seeded = tmp_path / "seeded.json"
    argv = ["--lines", "3", "--lines-items", "4", "--batch", "1", "--model", tiny_model_dir, "--no-sweeps"]
    res = run("bench", *argv, "--lines-seed", "3", "--json", seeded)
    assert res.exit_code == 0, res.output
    assert json.loads(seeded.with_suffix(".lines.json").read_text())["env"]["seed"] == 3
    assert items_receipt(3, random.Random("3-3")) != items_receipt(3, random.Random("0-3"))  # another draw
    mixed = tmp_path / "mixed.json"  # PIP in bfloat16, AR in float32: each at its fastest, said in env
    res = run("bench", *argv, "--compute", "bf16", "--ar-compute", "float32", "--json", mixed)
    assert res.exit_code == 0, res.output
    env = json.loads(mixed.with_suffix(".lines.json").read_text())["env"]
    assert (env["compute"], env["ar_compute"]) == ("bfloat16", "float32") and "PIP bfloat16, AR float32" in res.stdout
    assert result["env"]["compute"] == result["env"]["ar_compute"] == "float32"
    res = run("bench", "--model", tiny_model_dir)
    assert res.exit_code == 2 and "--lines" in res.output
    res = run("bench", "--lines", "1,x", "--model", tiny_model_dir)
    assert res.exit_code == 2 and "positive integers" in res.output


def test_bench_schema_and_a_document_without_items():
    from pipkie.eval.bench_items import items_schema

    assert items_schema(7) == KeySchema((), (Group("items", (Key("name"), Key("quantity"), Key("price")), 7),))
    assert Document("x").items({"name": "items.name"}) == []
