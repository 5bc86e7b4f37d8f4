"""Typed keys (`pipkie.decoding.types`): what counts as a date, a time, an amount, a phone number;
where a schema says so; and what the decoders answer for a value that is not of its type."""

import datetime

import pytest
import torch
from pydantic import BaseModel

from pipkie.decoding.types import implied_type, is_typed, reject, typed_start
from pipkie.schema import Key, KeySchema, SchemaError
from tests.test_extract import tiny_copy_extractor, tiny_extractor, tiny_model_dir  # noqa: F401

OF_TYPE = {
    "date": [
        "12/30/2016",
        "30.12.16",
        "2016-12-30",
        "30 Dec 2016",
        "Jul19'14",
        "ThuAug09,2012",
        "12/30/2016FRI",
        "04/11",
        "1/12",
        "15/APR/2017",
        "20180428",
        "2013/05",
        *("12 déc. 2019", "3 Okt 2019", "12 Mei 2019", "5 dic 2019", "1 März 2019", "Sept. 5, 2016"),  # month names
        *("2019年12月30日", "2019년 12월 30일"),
    ],
    "time": ["8:39AM", "13:46", "11:41A", "05:10:PM", "7:23:34P", "13h46", "8.39 pm", "14時30分", "14시 30분"],
    "money": [
        "$1,234.56",
        "12,00 EUR",
        "-5.00",
        "$108.85-",
        "£70.32",
        "Eur154,40",
        "224,400",
        "RM 12.50",
        "55.00S",  # a tax flag glued to the amount is part of the printed word
        "8.59-A",
        "5.00 €",
        *("¥850", "￥1280", "850円", "₩8500", "Rp 25000", "NT$120", "120 JPY"),  # currencies without cents
        *("Eur 154,40", "GBP 5.33", "$ 52.15", "kn 290,00", "Rs. 120.00", "S$ 5.00", "5.00 usd"),  # apart
        "p37.48",  # glued: part of the printed word
    ],
    "phone": ["(714)879-3574", "+60 3-1234 5678", "206-441-9785", "04.3388325", "01-23-45-67-89"],
}
NOT_OF_TYPE = {
    # numbers with slashes that name no day (`_on_the_calendar`)
    "date": ["206-441-9785", "12.99", "1 SOFTDRINKS 5", "7349944004", "8:39AM", "20181345"]
    + ["53/1", "050/00", "00/15/14", "13/13/2016", "2018-13-01", "Thu 53/1"]
    + ["Market 12", "Junction 5", "Deck 3", "OUT 12"]  # a month's name is a whole word
    + ["1/2", "3/4", "2-4"],  # two one-digit numbers: a fraction, a range
    "time": ["12.99", "12/30/2016", "TOTAL"],
    "money": ["2545", "1", "$5", "No.5", "¥8505 x", "Subtotal146.00", "12/30/2016"]
    + ["1.49 T", "33.99 -A", "5.00 S", "1.99 *", "2.00 #"]
    + ["7.75%", ":7.75%", "% 0.00", "@4.90%", "5.00 %"]  # `%` is never a currency: a rate
    + ["Paid 0.28", "OF 0.68", "ly: 0.00", "5.00 TAX", "8.00 SR", "3.99 CT"],  # a word apart is no currency
    "phone": ["12.99", "$60.44", "Tel:", "14000.00", "2018-03-31", "22-11-2014 20"],  # an amount, dates
}


@pytest.mark.parametrize("kind", OF_TYPE)
def test_what_a_type_accepts_and_refuses(kind):
    assert [v for v in OF_TYPE[kind] if not is_typed(kind, v)] == []
    assert [v for v in NOT_OF_TYPE[kind] if is_typed(kind, v)] == []
    assert reject(kind, NOT_OF_TYPE[kind][0]) is None and reject(kind, OF_TYPE[kind][0]) == OF_TYPE[kind][0]
    assert reject(None, "anything") == "anything"


def test_a_value_read_a_word_too_far_keeps_its_typed_beginning():
    assert reject("money", "1.49 T") == "1.49" and reject("money", "33.99 -A") == "33.99"
    assert reject("money", "1.99 *") == "1.99" and reject("money", "5.00 €") == "5.00 €"  # a marker, a currency
    assert reject("money", "20.41 CASH") == "20.41" and reject("money", "Paid 0.28") is None  # a word, a label
    assert reject("money", "12,00 EUR") == "12,00 EUR"  # a currency is part of it
    assert reject("date", "30/12/2016 13:45") == "30/12/2016" and reject("time", " 13:46  Table 4 ") == "13:46"
    assert reject("money", "Subtotal146.00") is None and reject("money", "TOTAL 12.00") is None  # only a beginning


def test_a_schema_says_the_type():
    ks = KeySchema.parse("company, date:date, total : money, items[name,price:text]")
    assert [k.type for k in ks] == [None, "date", "money"] and ks.names == ["company", "date", "total"]
    js = {
        "type": "object",
        "properties": {"d": {"type": "string", "format": "date"}, "e": {"type": "string", "format": "email"}},
    }
    assert [k.type for k in KeySchema.parse(js)] == ["date", None]  # formats that are not value types: unchecked

    class Receipt(BaseModel):
        date: datetime.date
        total: str
        note: str

    assert [k.type for k in KeySchema.parse(Receipt)] == ["date", "money", None]  # total: as its name says
    with pytest.raises(SchemaError, match="unknown value type 'dat'.*date, time, money, phone, or text"):
        KeySchema.parse("date:dat")


@pytest.mark.parametrize(
    "name, kind",
    [
        *[(n, "date") for n in ("date", "due_date", "DueDate", "invoice-date", "Date of issue")],
        *[(n, "time") for n in ("time", "checkout_time")],
        *[(n, "money") for n in ("total", "Sub-Total", "taxAmount", "tips", "total amount paid", "price")],
        *[(n, "phone") for n in ("tel", "phone_number", "Tel No", "fax")],
        # about something else than the value: untyped
        *[(n, None) for n in ("company", "address", "tax_rate", "invoice_no", "VATNumber", "card last digits")],
        *[(n, None) for n in ("payment_method", "cashier", "date_time", "total_items", "store_name")],
    ],
)
def test_a_keys_name_implies_its_type(name, kind):
    assert implied_type(name) == kind


def test_keys_written_plainly_take_the_type_their_name_says():
    ks = KeySchema.parse("company,date,address,total,items[name,quantity,price]")
    assert [k.type for k in ks] == [None, "date", None, "money"]
    assert [f.type for f in ks.groups[0].fields] == [None, None, "money"]
    assert [k.type for k in KeySchema.parse("date:text,total:time")] == [None, "time"]  # what is said stands
    js = {
        "type": "object",
        "properties": {
            "total": {"type": "string", "x-type": "text"},  # untyped, as said
            "created_date": {"type": "string", "format": "date-time"},  # a format we do not check: unchecked
            "tel": {"type": "string"},  # as its name says
        },
    }
    assert [k.type for k in KeySchema.parse(js)] == [None, None, "phone"]
    assert KeySchema.parse([Key("total")]).keys[0].type is None  # a Key built in Python keeps its type


def test_the_likeliest_start_that_begins_a_value_of_the_type():
    # two lines: "Tel 206-441-9785" / "Date 12/30/2016 FRI"; one token per word, decoded by a lookup
    words = ["Tel", " 206-441-9785", "Date", " 12/30", "/2016", " FRI"]
    ids, lines = torch.arange(len(words)), torch.tensor([0, 0, 1, 1, 1, 1])

    def decode(toks):
        return "".join(words[t] for t in toks)

    p = torch.tensor([0.05, 0.6, 0.05, 0.25, 0.03, 0.02])  # the phone number is likelier
    assert typed_start("date", decode, ids, lines, p) == (3, 2, pytest.approx(0.25))  # " 12/30" "/2016"
    assert typed_start("phone", decode, ids, lines, p)[:2] == (1, 1)
    assert typed_start("time", decode, ids, lines, p) is None  # no start begins a time


def test_a_date_start_must_name_a_day():
    # "53/1 67 89" (a table's numbers) is likelier than the date, but no day is the 53rd
    words = ["53/1", " 67", " 89", "JAN", " 24", "'13", " 12/30/2016"]
    ids, lines = torch.arange(len(words)), torch.tensor([0, 0, 0, 1, 1, 1, 2])
    p = torch.tensor([0.6, 0.05, 0.05, 0.2, 0.05, 0.0, 0.05])
    found = typed_start("date", lambda toks: "".join(words[t] for t in toks), ids, lines, p)
    assert found == (3, 3, pytest.approx(0.2))  # "JAN 24'13"


# glued to a word; a fraction apart from it; a run of numbers
@pytest.mark.parametrize("head", ["1/2PriceHappyHour!!!", "1/2 Price Happy Hour!!!", "1-01-0-01-007797"])
def test_a_date_start_stands_apart_from_what_follows(head):
    words = ["Detail#:", head, "Date", " 11/6/2011", "FRI 12/30/2016FRI"]
    ids, lines = torch.arange(len(words)), torch.tensor([0, 0, 1, 1, 2])
    p = torch.tensor([0.05, 0.65, 0.1, 0.15, 0.05])  # the copy head likes the line's second token best
    decode = lambda toks: "".join(words[t] for t in toks)  # noqa: E731
    assert typed_start("date", decode, ids, lines, p)[:2] == (3, 1)
    assert typed_start("date", decode, ids[4:], lines[4:], p[4:])[:2] == (0, 1)  # a day name glued is the date's


def test_the_hour_after_a_day_is_not_its_year():
    words = ["Jun", " 15", " 12", ":47", ":59", " 2011"]
    ids, lines = torch.arange(len(words)), torch.zeros(len(words), dtype=torch.long)
    p = torch.tensor([0.9, 0.02, 0.02, 0.02, 0.02, 0.02])
    found = typed_start("date", lambda toks: "".join(words[t] for t in toks), ids, lines, p)
    assert found[:2] == (0, 2)  # "Jun 15", not "Jun 15 12" of 12:47:59
    assert reject("date", "Jun 15 12:47:59 2011") == "Jun 15" and is_typed("date", "Jun 15 2011")


def test_an_amount_stops_before_the_next_amounts_currency():
    words = ["ROUNDING", " RM0.02", " RM", "14.20"]  # one line: the rounding, then the total
    ids, lines = torch.arange(len(words)), torch.zeros(len(words), dtype=torch.long)
    p = torch.tensor([0.1, 0.7, 0.1, 0.1])
    assert typed_start("money", lambda toks: "".join(words[t] for t in toks), ids, lines, p)[:2] == (1, 1)


@pytest.mark.parametrize("decode", ["pip", "ar-forced"])
def test_typed_keys_answer_a_value_of_their_type_or_unknown(tiny_copy_extractor, tiny_extractor, decode):
    """Random tiny models answer anything; with a type, only values of that type (or unknown)."""
    ex = tiny_copy_extractor if decode == "pip" else tiny_extractor
    text = "GOLDEN CAFE\nTel 206-441-9785\nDate 12/30/2016 FRI 8:39AM\nTOTAL $60.44"
    plain = ex.extract(None, "date:text,time:text,total:text,tel:text", decode=decode, text=text).values()
    typed = ex.extract(None, "date:date,time:time,total:money,tel:phone", decode=decode, text=text).values()
    kinds = {"date": "date", "time": "time", "total": "money", "tel": "phone"}
    assert any(v is not None and not is_typed(kinds[k], v) for k, v in plain.items())  # the check can fail
    assert all(v is None or is_typed(kinds[k], v) for k, v in typed.items())


def test_the_service_takes_typed_keys(tiny_copy_extractor):
    from fastapi.testclient import TestClient

    from pipkie.serve import create_app

    text = "GOLDEN CAFE\nTel 206-441-9785\nDate 12/30/2016 FRI 8:39AM\nTOTAL $60.44"
    with TestClient(create_app(tiny_copy_extractor)) as c:
        res = c.post("/extract", json={"text": text, "keys": "date:date,total:money"})
        assert res.status_code == 200, res.text
        fields = res.json()["fields"]
        assert set(fields) == {"date", "total"}
        assert all(f["value"] is None or is_typed(k, f["value"]) for k, f in zip(("date", "money"), fields.values()))
        bad = c.post("/extract", json={"text": text, "keys": "date:when"})
        assert bad.status_code == 422 and "unknown value type 'when'" in bad.text


def test_a_lists_field_can_be_typed():
    ks = KeySchema.parse("total:money, items[name, price:money]")
    assert [(f.name, f.type) for f in ks.groups[0].fields] == [("name", None), ("price", "money")]
    js = {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {"type": "object", "properties": {"price": {"type": "string", "x-type": "money"}}},
            }
        },
    }
    assert KeySchema.parse(js).groups[0].fields[0].type == "money"
    with pytest.raises(SchemaError, match="unknown value type 'cash'"):
        KeySchema.parse("items[name,price:cash]")


@pytest.mark.parametrize("decode", ["pip", "ar-forced"])
def test_a_lists_typed_field_answers_its_type_or_unknown(tiny_copy_extractor, tiny_extractor, decode):
    """Random tiny models put anything in an item's price; typed, only amounts (or unknown), and the
    list keeps its items (an unknown price does not end it)."""
    ex = tiny_copy_extractor if decode == "pip" else tiny_extractor
    text = "GOLDEN CAFE\n2 COFFEE 4.50 T\n1 BAGEL 2.25\n1 JUICE LARGE 3.10\nTOTAL $9.85"
    plain = ex.extract(None, "items[name,price:text]", decode=decode, text=text).fields["items"]
    typed = ex.extract(None, "items[name,price:money]", decode=decode, text=text).fields["items"]
    prices = [it["price"].value for it in plain]
    assert any(v is not None and not is_typed("money", v) for v in prices)  # the check can fail
    assert all(it["price"].value is None or is_typed("money", it["price"].value) for it in typed)
    assert [it["name"].value for it in typed] == [it["name"].value for it in plain]


def test_every_decoder_keeps_the_typed_beginning_of_a_value_read_too_far():
    from pipkie.decoding.results import FieldResult
    from pipkie.decoding.types import reject_untyped
    from pipkie.model.groups import ItemsResult

    schema = KeySchema.parse("total:money, date:date, items[name, price:money]")
    item = {"name": FieldResult("COFFEE", 0.9), "price": FieldResult("4.50 T", 0.8, truncated=True)}
    pred = {
        "total": FieldResult("TOTAL 9.85", 0.7),
        "date": FieldResult("12/30/2016 FRI", 0.6),
        "items": ItemsResult(items=[item], confidence=0.8),
    }
    out = reject_untyped(pred, schema)
    assert (out["total"].value, out["date"].value) == (None, "12/30/2016")
    (kept,) = out["items"].items
    assert (kept["name"].value, kept["price"].value, kept["price"].confidence) == ("COFFEE", "4.50", 0.8)
    assert pred["items"].items[0]["price"].value == "4.50 T"  # the decoder's own results are not changed


def test_amounts_are_read_in_cents_across_decimal_marks_and_signs():
    from pipkie.decoding.types import amount_cents

    cases = {
        "$1,234.56": 123456,
        "12,00 EUR": 1200,
        "1.234,56": 123456,
        "-5.00": -500,
        "(5.00)": -500,
        "$108.85-": -10885,
        "RM 12.50": 1250,
        "224,400": 22440000,
        "12.5": 1250,
        "RM0.02": 2,
    }
    assert {t: amount_cents(t) for t in cases} == cases
    assert [amount_cents(t) for t in ("2545", "1", "Subtotal146.00", None)] == [None] * 4
