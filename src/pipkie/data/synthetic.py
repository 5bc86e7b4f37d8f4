"""Synthetic labelled documents: Malaysian-style receipts (SROIE's keys) and key/value forms.

    docs = list(generate_receipts(100, seed=0, out_dir="runs/synth"))     # PNGs + Documents
    docs = list(generate_forms(10_000, seed=1, render=False))            # words + boxes only

Each document is rows of text segments (what an OCR engine returns: a vendor name, a label, an
amount), laid out by `pipkie.data.layout`: measured with a real font, optionally skewed, normalised
to 0-1000 boxes; `render=True` also draws the page and saves `{out_dir}/{id}.png`, `render=False`
skips all drawing (fast, for bulk pre-training data) and yields the very same words and boxes.

Receipts carry company (vendor name + SDN BHD / Sdn. Bhd. / ENTERPRISE ... suffixes), address
(2-4 printed lines, joined by spaces in the ground truth, as in SROIE), date (as printed, in one of
several formats) and total (as printed), among distractors: line items, subtotal, tax, rounding,
cash, change, GST ids, phone numbers. Forms carry 4-9 snake_case keys (name, date_of_birth, email,
ic_number, ...) printed under varying labels and layouts. Options: `layout_variety` (fonts, sizes,
alignment, item styles; off = one fixed template), `missing_prob` (a key is left out of the page
and the ground truth), `noise` (per-character OCR-like confusions in the words, not in the ground
truth or the image), `skew` (max rotation in degrees). Generation is deterministic for a seed
(document i depends only on seed and i), given the same Faker version and fonts.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from datetime import date, timedelta
from pathlib import Path

from faker import Faker

from pipkie.data.layout import FORM_FONTS, FORM_WIDTHS, RECEIPT_FONTS, RECEIPT_WIDTHS, Row, lay_out
from pipkie.data.vocab import MY_PRODUCTS, MY_SUFFIXES, MY_TRADES
from pipkie.io.document import Document

MONTHS = "JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split()
DATE_FORMATS = (
    "{d:02d}/{m:02d}/{Y}",
    "{d:02d}-{m:02d}-{y:02d}",
    "{d:02d} {b} {Y}",
    "{d:02d}/{m:02d}/{y:02d}",
    "{d:02d}.{m:02d}.{Y}",
    "{Y}-{m:02d}-{d:02d}",
    "{d:02d}-{b}-{Y}",
)


def _money(v: float) -> str:
    return f"{v:,.2f}" if v >= 1000 else f"{v:.2f}"


def _date(rng: random.Random, fmt: str | None = None, first_year: int = 2015, years: int = 5) -> str:
    day = date(first_year, 1, 1) + timedelta(days=rng.randrange(years * 365))
    fmt = fmt or rng.choice(DATE_FORMATS)
    month = MONTHS[day.month - 1]
    return fmt.format(
        d=day.day, m=day.month, Y=day.year, y=day.year % 100, b=month if rng.random() < 0.6 else month.title()
    )


def _company(rng: random.Random, fake: Faker) -> str:
    last, trade = fake.last_name().upper(), rng.choice(MY_TRADES)
    name = rng.choice(
        (
            f"{last} {trade}",
            f"{last} & {fake.last_name().upper()}",
            f"KEDAI {trade} {last}",
            f"{fake.word().upper()} {trade}",
            f"RESTORAN {last}",
            f"{last} {fake.word().upper()}",
        )
    )
    name = f"{name} {rng.choice(MY_SUFFIXES)}"
    return name if rng.random() < 0.8 else name.title().replace("Sdn Bhd", "Sdn. Bhd.")


def _address_lines(rng: random.Random, fake: Faker) -> list[str]:
    parts = [p.strip() for p in fake.address().replace("\n", ", ").split(",") if p.strip()]
    k = rng.randint(2, max(2, min(4, len(parts))))
    cuts = sorted(rng.sample(range(1, len(parts)), k - 1)) if len(parts) >= k else []
    chunks = [parts[a:b] for a, b in zip([0] + cuts, cuts + [len(parts)])]
    lines = [", ".join(c) + ("," if i < len(chunks) - 1 else ".") for i, c in enumerate(chunks)]
    return [s.upper() for s in lines] if rng.random() < 0.7 else lines


def _phone(rng: random.Random) -> str:
    return rng.choice(
        (
            f"0{rng.randint(3, 9)}-{rng.randrange(10**4):04d} {rng.randrange(10**4):04d}",
            f"01{rng.randint(0, 9)}-{rng.randrange(1000):03d} {rng.randrange(10**4):04d}",
        )
    )


def _ic_number(rng: random.Random) -> str:
    """A Malaysian identity card number: YYMMDD-PB-###G."""
    birth = f"{rng.randint(50, 99)}{rng.randint(1, 12):02d}{rng.randint(1, 28):02d}"
    return f"{birth}-{rng.randint(1, 16):02d}-{rng.randrange(10**4):04d}"


def _receipt(rng: random.Random, fake: Faker, fit, rule: str, missing_prob: float, variety: bool):
    """Rows (None = a small gap) and ground truth of one receipt; fit(text) wraps, rule is a ---- line."""
    keep = {k: rng.random() >= missing_prob for k in ("company", "date", "address", "total")}
    head_align = ("c", 0.5) if not variety or rng.random() < 0.7 else ("l", 0.0)
    company, address = _company(rng, fake), _address_lines(rng, fake)
    date_str = _date(rng) if variety else _date(rng, DATE_FORMATS[0])
    rows: list[Row | None] = []
    fields: dict[str, list[str]] = {}
    centre = lambda t: [(t, head_align[1], head_align[0])]  # noqa: E731
    if keep["company"]:
        rows += [centre(line) for line in fit(company)]
        fields["company"] = [company]
    if rng.random() < 0.6:
        rows.append(centre(f"({rng.randint(10000, 1299999)}-{rng.choice('ADHKMPTUVWX')})"))
    if keep["address"]:
        rows += [centre(part) for line in address for part in fit(line)]
        fields["address"] = [" ".join(address)]
    rows.append(centre(f"{rng.choice(('TEL', 'Tel', 'TEL NO', 'TEL/FAX'))}: {_phone(rng)}"))
    if rng.random() < 0.7:
        rows.append(centre(f"{rng.choice(('GST ID', 'GST REG NO', 'GST NO'))}: {rng.randrange(10**12):012d}"))
    rows += [None, centre(rng.choice(("TAX INVOICE", "SIMPLIFIED TAX INVOICE", "CASH RECEIPT", "RECEIPT")))]
    rows.append(
        [
            (
                f"{rng.choice(('INVOICE NO', 'Receipt #', 'BILL NO', 'DOC NO'))}: "
                f"{rng.choice(('CS', 'INV', 'R', ''))}{rng.randrange(10**8):08d}",
                0,
                "l",
            )
        ]
    )
    time_str = f"{rng.randint(8, 22):02d}:{rng.randrange(60):02d}"
    time_str += f":{rng.randrange(60):02d}" if rng.random() < 0.5 else ""
    date_at_end = variety and rng.random() < 0.2
    if keep["date"] and not date_at_end:
        rows.append(
            [(f"DATE: {date_str}", 0, "l"), (f"TIME: {time_str}", 1, "r")]
            if rng.random() < 0.5
            else [(f"{date_str} {time_str}", 0, "l")]
        )
        fields["date"] = [date_str]
    rows.append([(f"CASHIER: {fake.first_name().upper()}", 0, "l")])
    if rule:
        rows.append([(rule, 0.5, "c")])
    style = rng.choice("ab") if variety else "a"
    subtotal, qty_total = 0.0, 0
    for _ in range(rng.randint(1, 8)):
        name = rng.choice(MY_PRODUCTS) if rng.random() < 0.6 else f"{fake.word().upper()} {fake.word().upper()}"
        qty, price = rng.randint(1, 5), round(rng.uniform(0.5, 80.0), 2)
        amount = round(qty * price, 2)
        subtotal, qty_total = subtotal + amount, qty_total + qty
        if style == "a":
            rows += [[(name, 0, "l")], [(f"{qty} x {_money(price)}", 0.1, "l"), (_money(amount), 1, "r")]]
        else:
            rows.append([(name[:22], 0, "l"), (str(qty), 0.62, "r"), (_money(amount), 1, "r")])
    if rule:
        rows.append([(rule, 0.5, "c")])
    tax = round(subtotal * 0.06, 2) if rng.random() < 0.6 else 0.0
    raw = subtotal + tax
    total = round(round(raw * 20) / 20, 2)  # Malaysian 5-sen rounding
    rows.append([(rng.choice(("SUBTOTAL", "Sub Total", "TOTAL SALES (EXCL GST)")), 0, "l"), (_money(subtotal), 1, "r")])
    if tax:
        rows.append([(rng.choice(("GST 6%", "SST 6%", "SERVICE TAX 6%", "GST @6%")), 0, "l"), (_money(tax), 1, "r")])
    if abs(total - raw) > 0.001 and rng.random() < 0.7:
        rows.append([("ROUNDING ADJ", 0, "l"), (f"{total - raw:.2f}", 1, "r")])
    if keep["total"]:
        total_str = _money(total)
        label = rng.choice(("TOTAL", "TOTAL (RM)", "GRAND TOTAL", "NETT TOTAL", "TOTAL AMOUNT", "TOTAL INCL. GST"))
        row = [(label, 0, "l"), (total_str, 1, "r")]
        if rng.random() < 0.3:
            row.insert(1, ("RM", 0.7, "r"))
        rows.append(row)
        fields["total"] = [total_str]
    cash = total if rng.random() < 0.3 else float(math.ceil((total + 0.01) / 10) * 10 + rng.choice((0, 0, 10, 40)))
    rows += [[("CASH", 0, "l"), (_money(cash), 1, "r")], [("CHANGE", 0, "l"), (_money(cash - total), 1, "r")]]
    if rng.random() < 0.4:
        rows.append([(f"TOTAL QTY: {qty_total}", 0, "l")])
    if rng.random() < 0.3:
        rows += [
            None,
            [("GST SUMMARY", 0, "l"), ("AMOUNT", 0.7, "r"), ("TAX", 1, "r")],
            [("SR @ 6%", 0, "l"), (_money(subtotal), 0.7, "r"), (_money(tax), 1, "r")],
        ]
    if keep["date"] and date_at_end:
        rows += [None, [(f"{date_str} {time_str}", 0.5, "c")]]
        fields["date"] = [date_str]
    rows += [None] + [
        centre(t)
        for t in rng.sample(
            ("THANK YOU", "PLEASE COME AGAIN", "GOODS SOLD ARE NOT RETURNABLE", "THANK YOU & HAVE A NICE DAY"), 2
        )
    ]
    return rows, fields


FORM_FIELDS: dict[str, tuple[tuple[str, ...], Callable]] = {
    "name": (("Name", "Full Name", "Applicant Name", "NAME"), lambda r, f: f.name()),
    "date_of_birth": (("Date of Birth", "DOB", "Birth Date"), lambda r, f: _date(r, first_year=1950, years=55)),
    "phone": (("Phone", "Tel", "Telephone No.", "Contact No"), lambda r, f: _phone(r)),
    "email": (("Email", "E-mail", "Email Address"), lambda r, f: f.email()),
    "address": (("Address", "Mailing Address", "Home Address"), lambda r, f: " ".join(_address_lines(r, f))),
    "company": (("Company", "Employer", "Organisation"), lambda r, f: _company(r, f)),
    "date": (("Date", "Date Signed", "Submission Date"), lambda r, f: _date(r)),
    "invoice_number": (("Invoice No", "Invoice #", "Ref No"), lambda r, f: f"INV-{r.randrange(10**6):06d}"),
    "amount": (("Amount", "Total Amount", "Amount Due (RM)"), lambda r, f: _money(r.uniform(10, 9000))),
    "ic_number": (("IC No", "NRIC", "I/C Number"), lambda r, f: _ic_number(r)),
    "account_number": (("Account No", "A/C No", "Bank Account"), lambda r, f: f"{r.randrange(10**12):012d}"),
    "job_title": (("Position", "Job Title", "Designation"), lambda r, f: f.job()),
    "policy_number": (("Policy No", "Policy Number"), lambda r, f: f"P{r.randrange(10**9):09d}"),
}


def _form(rng: random.Random, fake: Faker, fit, rule: str, missing_prob: float, variety: bool):
    rows: list[Row | None] = [
        [
            (
                rng.choice(
                    ("APPLICATION FORM", "CUSTOMER REGISTRATION", "CLAIM FORM", "MEMBERSHIP FORM", "PAYMENT ADVICE")
                ),
                0.5,
                "c",
            )
        ],
        None,
    ]
    fields: dict[str, list[str]] = {}
    keys = rng.sample(sorted(FORM_FIELDS), rng.randint(4, 9))
    layout = rng.choice(("inline", "columns", "stacked", "two_up")) if variety else "columns"
    pending: Row = []
    for key in keys:
        labels, make = FORM_FIELDS[key]
        label, value = rng.choice(labels) + rng.choice((":", ":", "", " :")), make(rng, fake)
        if rng.random() < missing_prob:
            value = "_" * 12
        else:
            fields[key] = [value]
        if layout == "inline":
            rows += [[(line, 0, "l")] for line in fit(f"{label} {value}")]
        elif layout == "stacked":
            rows += [[(label, 0, "l")]] + [[(line, 0.04, "l")] for line in fit(value)] + [None]
        elif layout == "columns":
            lines = fit(value, 0.6)
            rows += [[(label, 0, "l"), (lines[0], 0.38, "l")]] + [[(line, 0.38, "l")] for line in lines[1:]]
        else:  # two_up: two short fields a row, long values on their own row
            lines = fit(f"{label} {value}", 0.48)
            if len(lines) > 1:
                rows += [[(line, 0, "l")] for line in fit(f"{label} {value}")]
            else:
                pending.append((lines[0], 0 if not pending else 0.52, "l"))
                if len(pending) == 2:
                    rows.append(pending)
                    pending = []
    if pending:
        rows.append(pending)
    rows += [
        None,
        [(rule, 0.5, "c")] if rule and rng.random() < 0.5 else None,
        [("Signature: ____________", 0, "l"), (f"Page 1 of {rng.randint(1, 3)}", 1, "r")],
    ]
    return rows, fields


def generate_receipts(
    n: int,
    seed: int = 0,
    *,
    out_dir: str | Path | None = None,
    render: bool = True,
    layout_variety: bool = True,
    missing_prob: float = 0.05,
    noise: float = 0.0,
    skew: float = 0.0,
    id_prefix: str = "synth-receipt",
    start: int = 0,
    rules: float = 1.0,
) -> Iterator[Document]:
    """Yield receipts start..n-1 with fields company/date/address/total (a generator; wrap in list())."""
    return lay_out(
        _receipt,
        n,
        seed,
        kind="receipt",
        fonts=RECEIPT_FONTS,
        widths=RECEIPT_WIDTHS,
        out_dir=out_dir,
        render=render,
        layout_variety=layout_variety,
        missing_prob=missing_prob,
        noise=noise,
        skew=skew,
        id_prefix=id_prefix,
        start=start,
        rules=rules,
    )


def generate_forms(
    n: int,
    seed: int = 0,
    *,
    out_dir: str | Path | None = None,
    render: bool = True,
    layout_variety: bool = True,
    missing_prob: float = 0.1,
    noise: float = 0.0,
    skew: float = 0.0,
    id_prefix: str = "synth-form",
    start: int = 0,
    rules: float = 1.0,
) -> Iterator[Document]:
    """Yield forms start..n-1 whose fields are 4-9 keys of FORM_FIELDS (a generator; wrap in list())."""
    return lay_out(
        _form,
        n,
        seed,
        kind="form",
        fonts=FORM_FONTS,
        widths=FORM_WIDTHS,
        out_dir=out_dir,
        render=render,
        layout_variety=layout_variety,
        missing_prob=missing_prob,
        noise=noise,
        skew=skew,
        id_prefix=id_prefix,
        start=start,
        rules=rules,
    )
