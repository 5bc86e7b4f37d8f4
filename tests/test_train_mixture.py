"""Training mixtures: key names as users write them, sources by weight, PIP and AR on the same data."""

import json
import random

import pytest

from pipkie.data import read_dataset
from pipkie.data.receipts import generate_world_receipts
from pipkie.data.sroie import in_dev
from pipkie.schema import Key
from pipkie.train.keys import ALIASES, sample_schemas, styled, surface
from pipkie.train.mixture import Mixture, span_templates, templates

FIELDS = {"store_name": "CHOEUN KOREANRESTAURANT", "date": "12/30/2016FRI", "total": "$60.44", "tips": None}


def test_styles_and_aliases_are_valid_key_names():
    rng = random.Random(0)
    for _canonical, names in ALIASES.items():
        for name in names:
            for _ in range(5):
                Key(styled(name, rng))  # raises on an invalid name
    assert styled("total amount", random.Random(3)) in {
        "total amount",
        "total_amount",
        "totalAmount",
        "Total Amount",
        "TOTAL AMOUNT",
    }
    assert surface("total", rng, variation=0.0) == "total"
    names = {surface("total", rng, variation=1.0).lower().replace("_", " ") for _ in range(200)}
    assert len(names) >= 5 and "amount paid" in names


def test_sampled_templates_hold_their_values():
    rng = random.Random(1)
    seen_absent = seen_described = 0
    for schema, values in sample_schemas(FIELDS, rng, 200, absent_pool=("tips", "tel"), value_len=len):
        assert set(values) == set(schema.names)
        for key in schema:
            v = values[key.name]
            assert v is None or key.max_tokens >= len(v) + 1  # the budget holds the value and an end
            seen_absent += v is None
            seen_described += key.description is not None
    assert 60 < seen_absent < 140 and seen_described > 30


def test_missing_keys_of_the_type_are_asked_like_present_ones():
    """With ask_missing, a key of the document's type that it lacks (tel here) is asked about as
    often as a present key and answers unknown; at 0 the draws are those of before the option."""

    def asked(ask_missing):
        pairs = sample_schemas(
            FIELDS, random.Random(3), 400, absent_pool=("tel",), value_len=len, variation=0.0,
            absent=0.0, ask_missing=ask_missing,
        )  # fmt: skip
        tel = [vals["tel"] for s, vals in pairs if "tel" in vals]
        return len(tel) / len(pairs), tel, pairs

    share, tel, _ = asked(1.0)
    assert 0.55 < share < 0.85 and set(tel) == {None}  # 1 - key_dropout = 0.7, as for a present key
    assert asked(0.0)[0] == 0.0  # absent=0: never asked
    kw = dict(absent_pool=("tel",), value_len=len, variation=0.0, absent=0.0)
    assert sample_schemas(FIELDS, random.Random(3), 400, **kw) == asked(0.0)[2]


def test_always_asked_keys_are_in_every_template_of_a_document_that_has_them():
    """always_ask puts the store name in every template, even at max_keys 1 and heavy dropout, and
    never asks a key the document lacks; empty, the draws are those of before the option."""
    kw = dict(value_len=len, variation=0.0, absent=0.0, key_dropout=0.9)
    pairs = sample_schemas(FIELDS, random.Random(4), 200, always_ask=("store_name", "tel"), max_keys=1, **kw)
    assert all(list(vals) == ["store_name"] for _, vals in pairs)
    pairs = sample_schemas(FIELDS, random.Random(4), 200, always_ask=("store_name",), **kw)
    assert all("store_name" in vals for _, vals in pairs)
    assert any(len(vals) > 1 for _, vals in pairs)  # other keys still come along
    without = sample_schemas(FIELDS, random.Random(4), 200, **kw)
    assert sum("store_name" in vals for _, vals in without) < 120  # dropped most of the time without it
    assert sample_schemas(FIELDS, random.Random(4), 200, always_ask=(), **kw) == without


def test_always_ask_reaches_a_sources_templates():
    mixture = Mixture.from_config([{"source": "world_receipts", "n": 5, "always_ask": ["store_name"]}], seed=0)
    (source,) = mixture.sources
    rng = random.Random(0)
    for i in range(5):
        pairs = templates(source, source.get(i, 0), rng, 4, value_len=len, key_dropout=0.9, absent=0.0, variation=0.0)
        assert all("store_name" in vals for _, vals in pairs)


def test_first_line_keys_are_taught_only_where_the_value_starts_on_the_first_line():
    """SROIE labels the registered company under a brand or a header; with first_line_keys such a
    document never teaches `company`, while one whose company opens the receipt still does."""
    from pipkie.io.document import Document
    from pipkie.train.mixture import Source

    fields = {"company": ["TASTE OF THE WORLD SDN BHD"], "total": ["9.90"]}
    below = Document(id="b", text="GEOVENTURE\nTASTE OF THE WORLD SDN BHD\nTOTAL 9.90", fields=fields)
    on_top = Document(id="t", text="TASTE OF THE WORLD SDN BHD\nTOTAL 9.90", fields=fields)
    kw = dict(value_len=len, key_dropout=0.0, absent=0.0, variation=0.0)
    for option, asked_below in (({"first_line_keys": ["company"]}, False), ({}, True)):
        source = Source("dataset", 1.0, option, [below, on_top], 2)
        rng = random.Random(0)
        assert all(("company" in v) == asked_below for _, v in templates(source, below, rng, 20, **kw))
        assert all("company" in v for _, v in templates(source, on_top, rng, 20, **kw))


def test_a_misspelt_mixture_option_is_an_error():
    with pytest.raises(ValueError, match=r"unknown mixture option\(s\) \['ask_mising'\]"):
        Mixture.from_config([{"source": "world_receipts", "n": 5, "ask_mising": 1.0}])


def test_span_templates_copy_what_follows_the_key():
    (doc,) = generate_world_receipts(1, seed=0, render=False)
    rng = random.Random(2)
    from pipkie.io.document import serialize

    text = " ".join(serialize(doc).split())
    for schema, values in span_templates(doc, rng, 5, value_len=len):
        for key in schema:
            assert values[key.name] in text


def test_mixture_draws_by_weight_and_refuses_test_splits(tmp_path, shared_data):
    with pytest.raises(ValueError, match="test split"):
        Mixture.from_config(
            [{"source": "dataset", "name": "sroie", "data_dir": str(shared_data / "sroie"), "split": "test"}]
        )
    with pytest.raises(ValueError, match="unknown mixture source"):
        Mixture.from_config([{"source": "nope"}])
    m = Mixture.from_config(
        [
            {"source": "world_receipts", "n": 50, "weight": 3},
            {"source": "dataset", "name": "sroie", "data_dir": str(shared_data / "sroie"), "split": "dev", "weight": 1},
        ],
        seed=0,
    )
    rng = random.Random(0)
    kinds = [m.draw(rng)[0].kind for _ in range(400)]
    assert 0.68 < kinds.count("world_receipts") / 400 < 0.82
    a = [m.draw(random.Random(5))[1].id for _ in range(3)]
    assert len(set(a)) == 1  # a draw is a function of the rng state
    src, doc = next((s, d) for s, d in (m.draw(rng) for _ in range(50)) if s.kind == "dataset")
    pairs = templates(src, doc, rng, 2, value_len=len, key_dropout=0.3, absent=1.0)
    assert all(any(v is None for v in vals.values()) for _, vals in pairs)  # an absent key in every template


def test_sroie_dev_is_carved_from_train(shared_data):
    dev = [d.id for d in read_dataset("sroie", shared_data / "sroie", "dev")]
    rest = [d.id for d in read_dataset("sroie", shared_data / "sroie", "train_nodev")]
    assert len(dev) == 59 and len(rest) == 567 and not set(dev) & set(rest)
    assert all(in_dev(i) for i in dev)


def test_pip_and_ar_runs_of_a_mixture_see_the_same_documents(tmp_path, monkeypatch):
    from pipkie.train import finetune as ft
    from pipkie.train.config import TrainConfig

    words = tmp_path / "words"
    words.mkdir()
    for d in generate_world_receipts(6, seed=9, render=False):
        (words / f"{d.id}.json").write_text(json.dumps({**d.to_dict(), "fields": {}}))
    seen: dict[str, list] = {"pip": [], "ar": []}
    real = ft.kv_instance

    def spy(builder, text, values, schemas, *, objective, rng, reveal=0.0):
        seen[objective].append((text, [s.names for s in schemas], values))
        return real(builder, text, values, schemas, objective=objective, rng=rng, reveal=reveal)

    monkeypatch.setattr(ft, "kv_instance", spy)
    mixture = [
        {"source": "world_receipts", "n": 20, "weight": 1},
        {"source": "self", "name": "words", "data_dir": str(words), "split": "all", "weight": 1},
    ]
    for objective in ("pip", "ar"):
        cfg = TrainConfig(
            objective=objective,
            base="compact",
            output_dir=str(tmp_path / objective),
            mixture=mixture,
            steps=2,
            batch_size=2,
            threads=1,
            bf16=False,
            lora_r=0,
            tokenizer_vocab=400,
            compact=dict(arch="qwen2", hidden=32, layers=1, heads=2, ffn=64),
            max_length=512,
            copy_head=objective == "pip",
            slot_tokens=8 if objective == "pip" else 0,
            field_blocks=objective == "pip",
            checkpoint_every=10,
        )
        summary = ft.finetune(cfg)
        assert summary["objective"] == objective and summary["steps"] == 2
    assert seen["pip"] == seen["ar"] and len(seen["pip"]) == 4
    saved = json.loads((tmp_path / "pip" / "model" / "pipkie.json").read_text())
    assert saved["budgets"]["store address"] == 64 and saved["copy_head"]
