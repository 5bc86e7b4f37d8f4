"""Synthetic receipts and invoices from many countries, with many keys and their line items.

    docs = list(generate_world_receipts(1000, seed=0, render=False))
    docs = list(generate_invoices(200, seed=0, out_dir="runs/inv"))   # + PNG pages

Each document draws a locale (`pipkie.data.locales`: money, date, time and phone formats, labels in
its language), a store or vendor, and a layout; what is printed next to what varies (a label and its
value are separate OCR segments, as annotators box them). Ground truth is what is printed, joined
in reading order for values over several segments (a two-line store name, a three-line address).

Receipt keys (`vocab.RECEIPT_KEYS`): store_name, store_addr, tel, date, time, receipt_number, cashier,
subtotal, discount, tax, tips, total, payment_method, card_last4, cash, change; invoice keys
(`vocab.INVOICE_KEYS`): vendor, vendor_address, vendor_tel, vat_id, invoice_number, invoice_date, due_date,
customer, customer_address, subtotal, tax, total. Each key is left out of some documents (an absent
key's gold is missing). Line items are parallel multi-valued fields `items.name`,
`items.quantity`, `items.unit_price`, `items.price` ("" where a line prints no such column).

Distractors on purpose: a subtotal, tax, cash and change next to the total; a phone next to an
id number; a second date (expiry, due date); prices in every item line. Noise, per document:
WildReceipt-style transcriptions with no spaces inside a segment (`glue`, in the words and the
ground truth alike) and OCR-like character errors in the words only (`noise`).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import timedelta
from functools import cache

from faker import Faker

from pipkie.data import locales as L
from pipkie.data.layout import FORM_FONTS, FORM_WIDTHS, RECEIPT_FONTS, RECEIPT_WIDTHS, lay_out
from pipkie.data.vocab import BRANDS, FOODS, GOODS, ITEM_FIELDS, SERVICES, TRADES
from pipkie.io.document import Document


@cache
def _faker(locale: str) -> Faker:
    return Faker(locale)


class Sheet:
    """Rows of printed segments; a segment given a key adds its printed text to that key's value."""

    def __init__(self, rng: random.Random, fit, glue: bool):
        self.rng, self.fit, self.glue = rng, fit, glue
        self.rows: list = []
        self.parts: dict[str, list[str]] = {}
        self.items: list[dict[str, str]] = []

    def shown(self, text: str) -> str:
        return text.replace(" ", "") if self.glue else text

    def row(self, *segs):
        """segs: (text, position 0-1, align "l"|"c"|"r"[, key]); a key's value gathers its segments."""
        out = []
        for seg in segs:
            text, pos, align, key = (*seg, None)[:4]
            text = self.shown(text)
            if not text:
                continue
            out.append((text, pos, align))
            if key:
                self.parts.setdefault(key, []).append(text)
        if out:
            self.rows.append(out)

    def wrapped(self, text: str, pos: float, align: str, key: str | None = None):
        for line in self.fit(text):
            self.row((line, pos, align, key))

    def gap(self):
        self.rows.append(None)

    def fields(self) -> dict[str, list[str]]:
        out = {k: [" ".join(v)] for k, v in self.parts.items()}
        if self.items:
            for f in ITEM_FIELDS:
                out[f"items.{f}"] = [self.shown(it.get(f, "")) for it in self.items]
        return out


def _store_name(rng, fake) -> list[str]:
    roll = rng.random()
    if roll < 0.25:
        return [rng.choice(BRANDS)] + (
            [rng.choice(("WHOLESALE", "#" + str(rng.randint(10, 999)), "SUPERCENTER"))] if rng.random() < 0.4 else []
        )
    if roll < 0.6:
        name = (
            f"{fake.last_name()}'s {rng.choice(TRADES).title()}"
            if rng.random() < 0.5
            else f"{fake.last_name().upper()} {rng.choice(TRADES)}"
        )
        return name.split(" ", 1) if rng.random() < 0.3 and " " in name else [name]
    if roll < 0.85:
        return [fake.company()]
    word = fake.word().upper()
    return [word, rng.choice(TRADES)]


def _address(fake) -> list[str]:
    return [p.strip() for p in fake.address().split("\n") if p.strip()]


def _items(sheet: Sheet, rng, loc, cur, goods: tuple) -> float:
    """Item lines in one of several styles; returns the sum of their prices."""
    style, total = rng.choice("abcdef"), 0.0
    for _ in range(rng.choice((1, 1, 2, 3, 4, 5, 6, 8, 10, 14, 20))):
        name = rng.choice(goods)
        if rng.random() < 0.3:
            name = f"{rng.randrange(10**4, 10**6)} {name}" if style == "e" else name.upper()
        qty = rng.choice((1, 1, 1, 2, 2, 3, 4, 6))
        unit = round(rng.choice((rng.uniform(0.5, 15), rng.uniform(5, 60))), 2)
        amount = round(qty * unit, 2)
        total += amount
        price = L.money(amount, loc, cur if rng.random() < 0.3 else "")
        unit_s = L.money(unit, loc, "")
        it = dict(name=name, price=price)
        flag = (rng.choice(("A", "E", "T", "1", "F", "N")), 1, "r") if style in "ce" and rng.random() < 0.7 else None
        if style == "a":  # "4x Name a 3,00   12,00"
            q = f"{qty}x"
            it.update(quantity=q, unit_price=unit_s if qty > 1 else "")
            segs = [(q, 0, "l", None), (name, 0.1, "l", None)]
            if qty > 1:
                segs.append((f"a {unit_s}", 0.55, "l", None))
            sheet.row(*segs, (price, 0.92, "r", None))
        elif style == "b":  # "Name   $12.00"
            it.update(quantity="", unit_price="")
            sheet.row((name, 0, "l", None), (price, 1, "r", None))
        elif style == "c":  # "2 Name  12.00 A"
            it.update(quantity=str(qty), unit_price="")
            sheet.row(
                (str(qty), 0, "l", None), (name, 0.08, "l", None), (price, 0.9, "r", None), *([flag] if flag else [])
            )
        elif style == "d":  # "Name" / "  2 @ 3.00      6.00"
            it.update(quantity=str(qty), unit_price=unit_s)
            sheet.row((name, 0, "l", None))
            sheet.row((f"{qty} @ {unit_s}", 0.06, "l", None), (price, 1, "r", None))
        elif style == "e":  # "55317 CHEVRON  34.49 A"
            it.update(quantity="", unit_price="")
            sheet.row((name, 0, "l", None), (price, 0.9, "r", None), *([flag] if flag else []))
        else:  # columns: "Name  Qty  Unit  Amount"
            it.update(name=name[:24], quantity=str(qty), unit_price=unit_s)
            sheet.row(
                (name[:24], 0, "l", None), (str(qty), 0.55, "r", None), (unit_s, 0.75, "r", None), (price, 1, "r", None)
            )
        sheet.items.append(it)
    return total


def _world_receipt(rng: random.Random, _fake, fit, rule: str, missing_prob: float, variety: bool):
    loc = L.LOCALES[rng.choice(sorted(L.LOCALES))]
    fake = _faker(loc.faker)
    fake.seed_instance(rng.randrange(2**32))
    sheet = Sheet(rng, fit, glue=rng.random() < 0.4)
    has = lambda key, p=1.0: rng.random() < p * (1 - missing_prob)  # noqa: E731
    cur = rng.choice(loc.currencies)
    align, pos = ("c", 0.5) if rng.random() < 0.75 else ("l", 0.0)
    restaurant = rng.random() < 0.45
    for line in _store_name(rng, fake):
        sheet.row((line, pos, align, "store_name"))
    if has("store_addr", 0.85):
        for line in _address(fake):
            sheet.wrapped(line, pos, align, "store_addr")
    if has("tel", 0.7):
        label = loc.label("tel", rng) if rng.random() < 0.6 else ""
        sheet.row(
            *([(label, 0.2, "l")] if label else []), (L.phone(loc, rng), pos if not label else 0.45, align, "tel")
        )
    if rng.random() < 0.3:
        sheet.row((f"{loc.label('vat_id', rng)} {rng.randrange(10**8, 10**11)}", pos, align))
    sheet.gap()
    day = L.random_day(rng)
    date_s, time_s = (
        L.format_date(day, rng.choice(loc.date_formats), rng),
        L.format_time(rng, rng.choice(loc.time_formats)),
    )
    show_date, show_time = has("date", 0.9), has("time", 0.8)
    number = f"{rng.choice(('', '#', 'R', 'T', 'INV'))}{rng.randrange(10**3, 10**9)}"
    when = rng.random()
    header_rows = []
    if rng.random() < 0.6:
        header_rows.append([(loc.label("receipt_number", rng), 0, "l"), (number, 0.4, "l", "receipt_number")])
    if rng.random() < 0.5:
        header_rows.append([(loc.label("cashier", rng), 0, "l"), (fake.first_name(), 0.4, "l", "cashier")])
    date_row = []
    if show_date:
        date_row += ([(loc.label("date", rng), 0, "l")] if rng.random() < 0.5 else []) + [(date_s, 0.15, "l", "date")]
    if show_time:
        date_row += ([(loc.label("time", rng), 0.6, "l")] if rng.random() < 0.4 else []) + [(time_s, 1, "r", "time")]
    if date_row and when < 0.7:
        header_rows.insert(rng.randrange(len(header_rows) + 1), date_row)
    for r in header_rows:
        sheet.row(*r)
    if restaurant and rng.random() < 0.5:
        sheet.row((f"Table {rng.randint(1, 40)}", 0, "l"), (f"Guests {rng.randint(1, 6)}", 1, "r"))
    if rule:
        sheet.row((rule, 0.5, "c"))
    subtotal = _items(sheet, rng, loc, cur, FOODS if restaurant else GOODS)
    if rule:
        sheet.row((rule, 0.5, "c"))
    if rng.random() < 0.3:
        sheet.row((f"{sum(1 for _ in sheet.items)} {loc.label('items', rng)}", 0, "l"))
    m = lambda v, c=cur: L.money(v, loc, c if rng.random() < 0.5 else "")  # noqa: E731
    discount = round(subtotal * rng.choice((0.05, 0.1, 0.15)), 2) if has("discount", 0.15) else 0.0
    rate = rng.choice(loc.tax_rates)
    tax = round((subtotal - discount) * rate, 2)
    tips = round(subtotal * rng.choice((0.1, 0.15, 0.18, 0.2)), 2) if restaurant and has("tips", 0.3) else 0.0
    total = round(subtotal - discount + tax + tips, 2)
    if has("subtotal", 0.65):
        sheet.row((loc.label("subtotal", rng), 0, "l"), (m(subtotal), 1, "r", "subtotal"))
    if discount:
        sheet.row((loc.label("discount", rng), 0, "l"), ("-" + m(discount), 1, "r", "discount"))
    if tax and has("tax", 0.85):
        label = loc.label("tax", rng)
        label += f" {rate * 100:g}%" if "%" not in label and rng.random() < 0.3 else ""
        sheet.row((label, 0, "l"), (m(tax), 1, "r", "tax"))
    if tips:
        sheet.row((loc.label("tips", rng), 0, "l"), (m(tips), 1, "r", "tips"))
    if has("total", 0.97):
        sheet.row((loc.label("total", rng), 0, "l"), (m(total), 1, "r", "total"))
    if rng.random() < 0.5:
        card = f"{rng.randrange(10**4):04d}"
        brand = loc.label("card", rng)
        sheet.row((brand, 0, "l", "payment_method"), (m(total), 1, "r"))
        if rng.random() < 0.7:
            sheet.row(
                (rng.choice(("XXXXXXXXXXXX", "************", "**** **** **** ", "Card # ")), 0, "l"),
                (card, 0.45, "l", "card_last4"),
            )
        if rng.random() < 0.4:
            sheet.row((f"AUTH CODE {rng.randrange(10**5, 10**6)}", 0, "l"))
    else:
        cash = float(int(total / 10 + 1) * 10) if rng.random() < 0.8 else total
        sheet.row((loc.label("cash", rng), 0, "l"), (m(cash), 1, "r", "cash"))
        sheet.row((loc.label("change", rng), 0, "l"), (m(cash - total), 1, "r", "change"))
    if date_row and when >= 0.7:
        sheet.gap()
        sheet.row(*date_row)
    if rng.random() < 0.3:  # a second date: a distractor
        other = L.format_date(L.random_day(rng), rng.choice(loc.date_formats), rng)
        sheet.row((rng.choice(("Valid until", "Return by", "Exp", "Member since")), 0, "l"), (other, 0.5, "l"))
    sheet.gap()
    for line in rng.sample(loc.labels.get("thanks") or L.EN_LABELS["thanks"], 1):
        sheet.wrapped(line, 0.5, "c")
    if rng.random() < 0.3:
        sheet.row((f"www.{fake.domain_name()}", 0.5, "c"))
    return sheet.rows, sheet.fields()


def _invoice(rng: random.Random, _fake, fit, rule: str, missing_prob: float, variety: bool):
    loc = L.LOCALES[rng.choice(sorted(L.LOCALES))]
    fake = _faker(loc.faker)
    fake.seed_instance(rng.randrange(2**32))
    sheet = Sheet(rng, fit, glue=rng.random() < 0.15)
    has = lambda p=1.0: rng.random() < p * (1 - missing_prob)  # noqa: E731
    cur = rng.choice(loc.currencies)
    sheet.row((fake.company(), 0, "l", "vendor"), (loc.label("invoice", rng), 1, "r"))
    for line in _address(fake):
        sheet.row((line, 0, "l", "vendor_address"))
    if has(0.7):
        sheet.row((loc.label("tel", rng), 0, "l"), (L.phone(loc, rng), 0.12, "l", "vendor_tel"))
    if has(0.6):
        sheet.row(
            (loc.label("vat_id", rng), 0, "l"),
            (f"{fake.country_code()}{rng.randrange(10**8, 10**10)}", 0.18, "l", "vat_id"),
        )
    sheet.gap()
    number = rng.choice(("INV-{:05d}", "{:06d}", "F{:07d}", "2023-{:04d}", "RE{:05d}")).format(
        rng.randrange(10**4, 10**5)
    )
    issued = L.random_day(rng)
    fmt = rng.choice(loc.date_formats)
    meta = [
        (rng.choice(("Invoice No:", "Invoice #", "Number:", "Rechnungsnr.", "N°")), number, "invoice_number"),
        (rng.choice(("Invoice Date:", "Date:", "Datum:", "Issued:")), L.format_date(issued, fmt, rng), "invoice_date"),
    ]
    if has(0.7):
        due = issued + timedelta(days=rng.choice((7, 14, 30, 60)))
        meta.append((loc.label("due", rng), L.format_date(due, fmt, rng), "due_date"))
    if rng.random() < 0.4:
        meta.append(("PO Number:", f"PO{rng.randrange(10**5, 10**6)}", None))
    rng.shuffle(meta)
    bill = [(loc.label("bill_to", rng), 0, "l")]
    customer = [fake.company() if rng.random() < 0.6 else fake.name()] + _address(fake)
    for i in range(max(len(meta), len(customer) + 1)):
        segs = []
        if i == 0:
            segs += bill
        elif i - 1 < len(customer):
            segs.append((customer[i - 1], 0, "l", "customer" if i == 1 else "customer_address"))
        if i < len(meta):
            label, value, key = meta[i]
            segs += [(label, 0.55, "l"), (value, 1, "r", key)]
        sheet.row(*segs)
    sheet.gap()
    sheet.row(("Description", 0, "l"), ("Qty", 0.55, "r"), ("Unit price", 0.75, "r"), ("Amount", 1, "r"))
    subtotal = 0.0
    for _ in range(rng.choice((1, 2, 3, 4, 6, 9, 12))):
        name, qty = rng.choice(SERVICES), rng.choice((1, 1, 2, 3, 5, 10, 20))
        unit = round(rng.uniform(5, 900), 2)
        amount = round(qty * unit, 2)
        subtotal += amount
        it = dict(name=name, quantity=str(qty), unit_price=L.money(unit, loc, ""), price=L.money(amount, loc, ""))
        sheet.row((name, 0, "l"), (it["quantity"], 0.55, "r"), (it["unit_price"], 0.75, "r"), (it["price"], 1, "r"))
        sheet.items.append(it)
    rate = rng.choice([r for r in loc.tax_rates if r] or [0.2])
    tax, total = round(subtotal * rate, 2), round(subtotal * (1 + rate), 2)
    sheet.row((loc.label("subtotal", rng), 0.55, "l"), (L.money(subtotal, loc, cur), 1, "r", "subtotal"))
    label = loc.label("tax", rng)
    sheet.row(
        (label if "%" in label else f"{label} {rate * 100:g}%", 0.55, "l"), (L.money(tax, loc, cur), 1, "r", "tax")
    )
    sheet.row((loc.label("total", rng), 0.55, "l"), (L.money(total, loc, cur), 1, "r", "total"))
    sheet.gap()
    if rng.random() < 0.6:
        sheet.wrapped(f"Payment within {rng.choice((7, 14, 30))} days. IBAN {fake.iban()}", 0, "l")
    return sheet.rows, sheet.fields()


def generate_world_receipts(
    n: int,
    seed: int = 0,
    *,
    out_dir=None,
    render: bool = True,
    missing_prob: float = 0.05,
    noise: float = 0.0,
    skew: float = 0.0,
    id_prefix: str = "world-receipt",
    start: int = 0,
    rules: float = 1.0,
) -> Iterator[Document]:
    """Yield receipts start..n-1 from the locales of `pipkie.data.locales` (fields: RECEIPT_KEYS and
    items.*); document i depends only on (seed, i)."""
    return lay_out(
        _world_receipt,
        n,
        seed,
        kind="world-receipt",
        fonts=RECEIPT_FONTS,
        widths=RECEIPT_WIDTHS,
        out_dir=out_dir,
        render=render,
        missing_prob=missing_prob,
        noise=noise,
        skew=skew,
        id_prefix=id_prefix,
        start=start,
        rules=rules,
    )


def generate_invoices(
    n: int,
    seed: int = 0,
    *,
    out_dir=None,
    render: bool = True,
    missing_prob: float = 0.05,
    noise: float = 0.0,
    skew: float = 0.0,
    id_prefix: str = "invoice",
    start: int = 0,
    rules: float = 1.0,
) -> Iterator[Document]:
    """Yield one-page invoices start..n-1 (fields: INVOICE_KEYS and items.*)."""
    return lay_out(
        _invoice,
        n,
        seed,
        kind="invoice",
        fonts=FORM_FONTS,
        widths=FORM_WIDTHS,
        out_dir=out_dir,
        render=render,
        missing_prob=missing_prob,
        noise=noise,
        skew=skew,
        id_prefix=id_prefix,
        start=start,
        rules=rules,
    )
