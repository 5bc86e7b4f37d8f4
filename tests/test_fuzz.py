"""Property-based fuzzing (hypothesis) of everything that reads untrusted input.

- loaders: files of every accepted type (PNG, JPEG, TIFF, GIF, BMP, WebP, PDF, JSON words, box
  file, text), truncated and mutated, and random bytes under every name and content type: a
  Document within the limits, or DocumentError; never any other exception;
- keys and schemas: unicode, empty, duplicate, huge, of the wrong type: a KeySchema within
  max_keys, or a 422;
- templates: random keys, budgets, documents and context sizes: PIP and AR inputs that fit
  `max_length` with every slot where it says, or DocumentTooLong;
- request parsing: random JSON bodies and raw bytes as JSON or multipart: an ExtractRequest whose
  load gives a Document or DocumentError, or a 4xx.

CI runs `PIPKIE_FUZZ_EXAMPLES` (default 60) examples per test, 360 in all; the long run is
`PIPKIE_FUZZ_EXAMPLES=10000 .venv/bin/python -m pytest -q tests/test_fuzz.py`.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import os
import re
import threading
from unittest import mock

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from PIL import Image

import pipkie.io.loaders as loaders
from pipkie.io.document import Document, serialize
from pipkie.io.loaders import DocumentError, load_document
from pipkie.io.ocr import OCRWord
from pipkie.model.template import DocumentTooLong, TemplateBuilder
from pipkie.schema import Key, KeySchema
from pipkie.serve import ServeSettings
from pipkie.serve.errors import ApiError
from pipkie.serve.parsing import JSON_FIELDS, parse_extract, parse_keys, replay
from tests.test_loaders import make_text_pdf

EXAMPLES = int(os.environ.get("PIPKIE_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
CODES = {
    "unreadable_document",
    "unsupported_type",
    "empty_document",
    "invalid_words",
    "too_many_pages",
    "too_many_pixels",
    "too_many_words",
}
LIMITS = {"max_pages": 4, "max_pixels": 4_000_000, "max_words": 300}
KEY_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\- ]*$")


class FakeEngine:
    """OCR stand-in: one word per text band of the image (OCR quality is not what is fuzzed)."""

    name = "fake"

    def __call__(self, image):
        w, h = image.size
        return [OCRWord(f"w{i}", (0, i * h / 4, w / 2, (i + 1) * h / 4), 0.9) for i in range(4)]


def _image(fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im = Image.new("RGB", (64, 48), "white")
    im.paste((0, 0, 0), (8, 8, 40, 20))
    im.save(buf, fmt, **kw)
    return buf.getvalue()


@functools.cache
def seeds() -> dict[str, tuple[bytes, str, str | None]]:
    """One small valid file of every accepted type: (bytes, name, content type)."""
    tiff = io.BytesIO()
    Image.new("L", (40, 30), 255).save(tiff, "TIFF", save_all=True, append_images=[Image.new("L", (30, 40), 0)])
    words = {
        "id": "w",
        "words": [{"text": "TOTAL", "box": [10, 10, 90, 30]}, {"text": "9.90", "box": [100, 10, 160, 30], "page": 1}],
        "page_sizes": [[200, 100]] * 2,
    }
    return {
        "png": (_image("PNG"), "a.png", "image/png"),
        "jpeg": (_image("JPEG"), "a.jpg", "image/jpeg"),
        "gif": (_image("GIF"), "a.gif", "image/gif"),
        "bmp": (_image("BMP"), "a.bmp", "image/bmp"),
        "webp": (_image("WEBP"), "a.webp", "image/webp"),
        "tiff": (tiff.getvalue(), "a.tiff", "image/tiff"),
        "pdf": (
            make_text_pdf([[(72, 700, 12, "INVOICE 7"), (72, 300, 12, "TOTAL 9.90")], [(72, 700, 12, "p2")]]),
            "a.pdf",
            "application/pdf",
        ),
        "json": (json.dumps(words).encode(), "a.json", "application/json"),
        "box": (b"10,10,90,10,90,30,10,30,TOTAL\n100,10,160,10,160,30,100,30,9.90\n", "a.txt", "text/plain"),
        "text": ("Invoice 7\nTotal: 9,90 €\n".encode(), "a.txt", "text/plain"),
    }


NAMES = ["upload", "x.png", "x.jpg", "x.pdf", "x.json", "x.txt", "x.tiff", "x.bin"]
TYPES = [
    None,
    "application/octet-stream",
    "image/png",
    "image/jpeg",
    "application/pdf",
    "application/json",
    "text/plain",
]


@st.composite
def mutated_files(draw):
    """A seed file, cut, overwritten, spliced and cut short, under its own or another name/type."""
    data, name, ctype = draw(st.sampled_from(sorted(seeds().values())))
    data = bytearray(data)
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["truncate", "overwrite", "insert", "delete"]))
        i = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "truncate":
            del data[i:]
        elif op == "overwrite" and data:
            data[i : i + 1] = bytes([draw(st.integers(0, 255))])
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=16))
        else:
            del data[i : i + draw(st.integers(1, 64))]
    name = draw(st.sampled_from([name, *NAMES]))
    ctype = draw(st.sampled_from([ctype, *TYPES]))
    return bytes(data), name, ctype


def load_or_error(data: bytes, name: str, ctype: str | None):
    """The Document, or the DocumentError: any other exception fails the test."""
    with mock.patch.object(loaders, "get_engine", lambda name="rapidocr", threads=1: FakeEngine()):
        try:
            return load_document(data, filename=name, content_type=ctype, dpi=30, **LIMITS)
        except DocumentError as e:
            return e


def check_outcome(outcome, name: str) -> None:
    event(f"outcome: {getattr(outcome, 'code', 'document')}")  # --hypothesis-show-statistics shows the mix
    if isinstance(outcome, DocumentError):
        assert outcome.code in CODES and str(outcome).startswith(name) and outcome.reason
        return
    assert isinstance(outcome, Document) and isinstance(serialize(outcome), str)
    assert len(outcome.words) <= LIMITS["max_words"] and len(outcome.page_sizes) <= LIMITS["max_pages"]
    for w in outcome.words:
        assert all(0 <= v <= 1000 for v in w.box) and w.box[0] <= w.box[2] and w.box[1] <= w.box[3] and w.text.strip()
        assert 0 <= w.page < max(1, len(outcome.page_sizes))


@FUZZ
@given(mutated_files())
def test_loaders_survive_mutated_files(sample):
    data, name, ctype = sample
    check_outcome(load_or_error(data, name, ctype), name)


@FUZZ
@given(
    st.binary(max_size=2048),
    st.sampled_from(NAMES),
    st.sampled_from(TYPES),
    st.sampled_from(
        [
            b"",
            b"%PDF-1.4\n",
            b"\x89PNG\r\n\x1a\n",
            b"\xff\xd8\xff",
            b"II*\x00",
            b"GIF89a",
            b'{"words": ',
            b"1,2,3,4,5,6,7,8,",
        ]
    ),
)
def test_loaders_survive_random_bytes(data, name, ctype, magic):
    check_outcome(load_or_error(magic + data, name, ctype), name)


# ---- keys and schemas ---------------------------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
key_names = st.text(max_size=70) | st.sampled_from(
    ["total", "Total", " total ", "a,b", "", " ", "to:tal", "ümlaut", "x" * 65, "date.of-issue 2"]
)
properties = st.dictionaries(
    key_names,
    st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(["string", "integer", ["string", "null"], ["null"], [1], None]) | json_values,
            "maxLength": st.integers(-5, 5000) | json_values,
            "x-max-tokens": st.integers(-5, 500) | json_values,
            "description": st.text(max_size=300) | json_values,
            "anyOf": st.lists(
                st.fixed_dictionaries({"type": st.sampled_from(["string", "null", "number"])}), max_size=3
            )
            | json_values,
        },
    )
    | json_values,
    max_size=12,
)
good_names = st.from_regex(r"\A[A-Za-z0-9_][A-Za-z0-9_.\- ]{0,20}\Z")
good_properties = st.dictionaries(
    good_names,
    st.fixed_dictionaries(
        {"type": st.sampled_from(["string", ["string", "null"]])},
        optional={"maxLength": st.integers(1, 300), "description": st.text(max_size=50)},
    ),
    min_size=1,
    max_size=10,
)
schemas = (
    st.none() | json_values | st.builds(lambda p: {"type": "object", "properties": p}, properties | good_properties)
)
keys_values = (
    st.none()
    | st.text(max_size=200)
    | st.lists(key_names | json_values, max_size=70)
    | json_values
    | st.lists(good_names, min_size=1, max_size=12)
    | st.lists(good_names, max_size=12).map(",".join)
)


@FUZZ
@given(
    st.tuples(keys_values, st.none())
    | st.tuples(st.none(), schemas | schemas.map(json.dumps))
    | st.tuples(keys_values, schemas),
    st.integers(1, 64),
)
def test_keys_and_schemas_are_read_or_refused(spec, max_keys):
    keys, schema = spec
    try:
        ks = parse_keys(keys, schema, max_keys, ["total", "date"])
    except ApiError as e:
        event("refused")
        assert e.status == 422 and e.code == "invalid_keys" and e.detail
        return
    event("keys")
    assert isinstance(ks, KeySchema) and 1 <= len(ks) <= max_keys and len(set(ks.names)) == len(ks)
    assert all(KEY_NAME.match(k.name) and ":" not in k.name and len(k.name) <= 64 for k in ks)


# ---- templates ----------------------------------------------------------------------------------
@functools.cache
def builder(max_length: int, default_budget: int, slot_tokens: int, field_blocks: bool, copy: bool) -> TemplateBuilder:
    from pipkie.model.template import SPECIAL_TOKENS
    from pipkie.train.tokenizer import train_tokenizer

    tok = train_tokenizer(
        ["TOTAL 9.90 Invoice company date address unknown : \n ümlaut 12/03/2019"] * 20,
        vocab_size=300,
        special=list(SPECIAL_TOKENS),
    )  # one per builder: slot tokens differ
    return TemplateBuilder(
        tok,
        max_length=max_length,
        default_budget=default_budget,
        slot_tokens=slot_tokens,
        field_blocks=field_blocks,
        copy=copy,
    )


valid_keys = st.lists(
    st.builds(
        Key,
        st.from_regex(r"\A[A-Za-z0-9_][A-Za-z0-9_.\- ]{0,15}\Z"),
        st.none() | st.text(max_size=40),
        st.none() | st.integers(1, 40),
        st.none() | st.integers(1, 80),
    ),
    min_size=1,
    max_size=8,
    unique_by=lambda k: k.name.strip(),
)


@FUZZ
@given(
    keys=valid_keys,
    text=st.text(max_size=300) | st.text(min_size=300, max_size=3000),
    values=st.none() | st.dictionaries(st.text(max_size=10), st.none() | st.text(max_size=60), max_size=4),
    config=st.tuples(
        st.sampled_from([48, 128, 512, 1024]),
        st.sampled_from([1, 4, 16]),
        st.sampled_from([0, 4]),
        st.booleans(),
        st.booleans(),
    ),
)
def test_templates_fit_or_refuse(keys, text, values, config):
    b = builder(*config)
    schema = KeySchema(tuple(keys))
    values = {**(values or {}), **{k.name: (values or {}).get(k.name) for k in keys}} if values is not None else None
    try:
        enc = b.pip(text, schema, values)
    except DocumentTooLong:
        event("pip: too long")
        assert b.document_room(b.template_length(schema)) < 1
    else:
        event(f"pip: {'cut' if enc.truncated else 'whole'}")
        assert len(enc.input_ids) <= b.max_length and len(enc.fields) == len(schema)
        assert enc.prefix_len + b.template_length(schema) == len(enc.input_ids)
        for f in enc.fields:
            assert [enc.input_ids[f.start + j] for j in range(f.length)] == [b.slot_input(j) for j in range(f.length)]
        assert values is None or len(enc.targets) == len(enc.input_ids)
    try:
        enc = b.ar(text, schema, values or {})
    except DocumentTooLong:
        assert b.document_room(b.ar_reserved(schema), answer=False) < 1
    else:
        assert len(enc.input_ids) <= b.max_length and len(enc.targets) == len(enc.input_ids)


# ---- request parsing ----------------------------------------------------------------------------
words = st.lists(
    st.fixed_dictionaries(
        {
            "text": st.text(max_size=12),
            "box": st.lists(st.integers(0, 1000), min_size=4, max_size=4)
            | st.lists(st.integers(-5, 1005) | st.floats(), max_size=9),
        },
        optional={"page": st.integers(-1, 6) | json_values},
    )
    | json_values,
    max_size=40,
)
plausible = st.builds(
    lambda doc, extra: {**doc, **extra},
    st.fixed_dictionaries({"words": words}) | st.fixed_dictionaries({"text": st.text(max_size=200)}),
    st.fixed_dictionaries(
        {},
        optional={
            "keys": st.lists(good_names, min_size=1, max_size=10),
            "decode": st.sampled_from(["pip", "ar-free", "ar-forced"]),
            "refine_steps": st.integers(0, 8),
            "id": st.text(max_size=20),
            "normalized": st.booleans(),
            "page_sizes": st.lists(st.lists(st.integers(1, 3000), min_size=2, max_size=2), max_size=5),
        },
    ),
)
bodies = (
    plausible
    | st.fixed_dictionaries(
        {},
        optional={
            "words": words,
            "text": st.text(max_size=200) | json_values,
            "page_sizes": st.lists(st.lists(st.integers(-1, 3000), min_size=2, max_size=2) | json_values, max_size=6)
            | json_values,
            "normalized": st.booleans() | json_values,
            "keys": keys_values,
            "schema": schemas,
            "decode": st.sampled_from(["pip", "ar-free", "ar-forced", "ar", "beam", ""]) | json_values,
            "refine_steps": st.integers(-2, 12) | json_values,
            "id": st.text(max_size=30) | json_values,
        },
    )
    | st.dictionaries(st.sampled_from(sorted(JSON_FIELDS)) | st.text(max_size=8), json_values, max_size=6)
)
SETTINGS = ServeSettings(max_pages=4, max_words=300, max_keys=8, max_upload_mb=0.25)


def request(body: bytes, content_type: str):
    from starlette.requests import Request

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/extract",
        "query_string": b"",
        "state": {},
        "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())],
    }
    return Request(scope, replay(body))


def parse_and_load(body: bytes, content_type: str):
    """ExtractRequest then its Document (or DocumentError), or the ApiError; anything else fails."""
    try:
        parsed = asyncio.run(parse_extract(request(body, content_type), SETTINGS, ["total", "date"]))
    except ApiError as e:
        event(f"refused: {e.code}")
        assert 400 <= e.status < 500 and e.code and e.detail
        return e
    assert 1 <= len(parsed.schema) <= SETTINGS.max_keys and parsed.kind in ("ocr", "parse")
    with mock.patch.object(loaders, "get_engine", lambda name="rapidocr", threads=1: FakeEngine()):
        try:
            doc = parsed.load(threading.Event())
        except DocumentError as e:
            event(f"load refused: {e.code}")
            assert e.code in CODES
            return e
    event("document")
    assert isinstance(doc, Document) and len(doc.words) <= SETTINGS.max_words
    return doc


@FUZZ
@given(bodies)
def test_json_requests_are_parsed_or_refused(body):
    parse_and_load(json.dumps(body).encode(), "application/json")


@FUZZ
@given(
    st.binary(max_size=600) | mutated_files().map(lambda f: f[0][:600]),
    st.sampled_from(
        [
            "application/json",
            "multipart/form-data",
            "multipart/form-data; boundary=x",
            "multipart/form-data; boundary=" + "b" * 80,
        ]
    ),
)
def test_raw_bodies_are_parsed_or_refused(raw, content_type):
    if content_type.endswith("boundary=x"):  # a well-framed form around the bytes, as a file upload
        raw = (
            b'--x\r\nContent-Disposition: form-data; name="file"; filename="f.bin"\r\n'
            b"Content-Type: application/octet-stream\r\n\r\n" + raw + b"\r\n--x--\r\n"
        )
    parse_and_load(raw, content_type)
