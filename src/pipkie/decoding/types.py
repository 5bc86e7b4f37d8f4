"""Typed keys: a value that must be a date, a time, an amount or a phone number.

A key (flat, or a list's field: `items[name,price:money]`) may say what kind of value it wants
(`Key.type`: `date:date` in the shorthand, JSON schema's `"format": "date"`, pydantic's
`datetime.date`), and a key written without one takes the type its name plainly says
(`implied_type`: `date`, `total`, `tel`; `date:text` keeps it untyped). The type is not written into
the template (the model was not trained with it): it constrains decoding, in the same pass.

- PIP (`typed_start`): when the decoded value is not of its type, the copy head's start
  distribution already ranks the document's other places; the value becomes the first of its
  `TOP_STARTS` likeliest starts whose rest of the line begins with a value of the type (as many
  tokens as that value takes), with the copy head's probability of that start as its confidence.
  When none of them does, the key answers `unknown`.
- Every decoder, last (`reject_untyped`, in `Decoder.__call__` after values are snapped to words):
  a value not of its type keeps its longest beginning, cut between words, that is of it (a value
  read one word too far: `1.49 T`), or answers `unknown`. That is AR's whole rule, as it has no
  ranked alternatives without decoding again; for PIP it catches what snapping made of a typed value.

A value *is* of its type when the type's pattern matches all of it (spaces at its ends aside),
and it is not plainly something else (`_match`: a date's numbers name a day, `53/1` does not; a
phone number is not an amount or a date with its year).
The patterns accept the ways receipts and invoices print these things across locales
(`12/30/2016`, `30.12.16`, `2016-12-30`, `30 Dec 2016`, `15/APR/2017`, `20180428`, `Jul19'14`,
`ThuAug09,2012`, `12 déc. 2019`, `2019年12月30日`; `8:39AM`, `13:46`, `11:41A`, `14時30分`;
`$1,234.56`, `12,00 EUR`, `-5.00`, `¥850`; `(714)879-3574`, `+60 3-1234 5678`); a value that
glues other text to its type's (`Subtotal146.00`) is not one, and a currency after an amount is a
whole word (`RM0.02` of `RM0.02 RM14.20`). Chosen on WildReceipt dev and SROIE dev (docs/RESULTS.md
"Typed keys"; the other languages' forms in "Month names").
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the schema reads the type names; torch is not imported for that
    import torch


def _one_of(words) -> str:
    """A regex of any one of `words` as a whole word (longest first, an optional `.` after it, no
    letter after that): month names, currency codes."""
    return rf"(?:{'|'.join(sorted(set(words), key=len, reverse=True))})\.?(?![^\W\d_])"


# a month's name as receipts print it: English, German, French, Spanish, Italian, Dutch, Portuguese,
# Indonesian/Malay abbreviations and names, a whole word (`Market 12` is no date) or glued to digits
# (`Jul19'14`); abbreviations that are common words or labels on receipts (`out`, `set`, `gen`) left out
_MONTH_NAMES = (
    "jan january feb february mar march apr april may jun june jul july aug august sep sept september "
    "oct october nov november dec december januar februar märz maerz mär mai juni juli okt oktober dez "
    "dezember janv janvier févr février fevr fevrier mars avr avril juin juil juillet août aout "
    "septembre octobre novembre déc décembre decembre ene enero febrero marzo abr abril mayo junio "
    "julio ago agosto septiembre setiembre octubre noviembre dic diciembre gennaio febbraio aprile "
    "mag maggio giu giugno lug luglio settembre ott ottobre dicembre januari februari maart mrt mei "
    "augustus fev fevereiro março marco maio junho julho setembro outubro novembro dezembro maret "
    "agu agt agustus desember ogos disember"
).split()
_MONTH = _one_of(_MONTH_NAMES)
_DAY_NAME = r"(?:mon|tue|wed|thu|fri|sat|sun)[a-z]*\.?"
_NUMERIC_DATE = r"(?:\d{1,4}[/-]\d{1,2}(?:[/-]\d{2,4})?|\d{1,2}\.\d{1,2}\.\d{2,4}|\d{4}\.\d{1,2}\.\d{1,2})(?!\d)"
_COMPACT_DATE = r"(?:19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])(?!\d)"  # 20180428: a year first
_CJK_DATE = r"\d{2,4}\s?[年년]\s?\d{1,2}\s?[月월]\s?\d{1,2}\s?[日일]?(?!\d)"  # 2019年12月30日, 2019년 12월 30일
_YEAR = r"(?:(?!\s+\d{1,2}:\d)[\s./,-]*'?\d{2,4})"  # not the hour of a time: `Jun 15 12:47` is `Jun 15`
_DAY_MONTH = rf"\d{{1,2}}(?:st|nd|rd|th)?[\s./-]*{_MONTH}{_YEAR}?(?!\d)"  # 15/APR/2017
_MONTH_DAY = rf"{_MONTH}[\s./-]*\d{{1,2}}(?:st|nd|rd|th)?{_YEAR}?(?!\d)"
_AMPM = r"\s*:?[ap]\.?(?:m\.?)?"  # 8:39AM, 11:41A, 05:10:PM
_WHOLE_BEFORE = r"[¥￥₩₫]|Rp\.?|IDR|JPY|KRW|VND|NT\$"  # currencies printed without cents, before the amount
_WHOLE_AFTER = r"[円원₫]|JPY|KRW|VND|IDR"  # …and after it
# a word printed apart from an amount is its currency only when it is one (`Paid 0.28`, `5.00 TAX` are a
# label and an amount): symbols, an ISO 4217 code or a local abbreviation (any case), a country's dollar
_ISO_4217 = (
    "AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BHD BIF BMD BND BOB BRL BSD BTN BWP BYN BZD "
    "CAD CDF CHF CLP CNY COP CRC CUP CVE CZK DJF DKK DOP DZD EGP ERN ETB EUR FJD FKP GBP GEL GHS GIP GMD "
    "GNF GTQ GYD HKD HNL HTG HUF IDR ILS INR IQD IRR ISK JMD JOD JPY KES KGS KHR KMF KRW KWD KYD KZT LAK "
    "LBP LKR LRD LSL LYD MAD MDL MGA MKD MMK MNT MOP MRU MUR MVR MWK MXN MYR MZN NAD NGN NIO NOK NPR NZD "
    "OMR PAB PEN PGK PHP PKR PLN PYG QAR RON RSD RUB RWF SAR SBD SCR SDG SEK SGD SHP SLE SOS SRD SSP STN "
    "SVC SYP SZL THB TJS TMT TND TOP TRY TTD TWD TZS UAH UGX USD UYU UZS VES VND VUV WST XAF XCD XOF XPF "
    "YER ZAR ZMW ZWL"
).split()
_LOCAL_CURRENCIES = "RM Rs Rp kn kr Ft zł Kč Lei Lek Dh Dhs TL Bs QR Br Eur Euro Euros NT NTD RMB Yen Won Baht Fr sFr"
_CODE = rf"(?i:{_one_of([*_ISO_4217, *_LOCAL_CURRENCIES.split()])})"
_CURRENCY = rf"(?:[^\w\s%]{{1,4}}|{_CODE}|[A-Z]{{1,3}}\$)"  # printed apart: `$ 5.00`, `EUR 5.00`, `S$ 5.00`
_AMOUNT_DIGITS = r"-?(?:\d{1,3}(?:[,.\s']\d{3})+(?:[.,]\d{1,2})?|\d+[.,]\d{1,2})(?!\d|\s?%)"

VALUE_TYPES: dict[str, re.Pattern] = {
    "date": re.compile(
        rf"(?:{_DAY_NAME},?\s*)?(?:{_COMPACT_DATE}|{_CJK_DATE}|{_NUMERIC_DATE}|{_DAY_MONTH}|{_MONTH_DAY})(?:{_DAY_NAME})?",
        re.I,
    ),
    # 12:30, 12:30:05, 13h46, 8.39 pm (a dot only with am/pm: 12.99 is a price), 14時30分, 14시 30분
    "time": re.compile(
        rf"\d{{1,2}}(?:[:h]\d{{2}}(?::\d{{2}})?(?:{_AMPM})?|\.\d{{2}}\s*[ap]\.?m\.?)(?!\d)"
        r"|\d{1,2}\s?[時시]\s?\d{1,2}\s?[分분]?(?!\d)",
        re.I,
    ),
    # an amount with cents or thousands groups, a currency before or after it, a sign or a trailing
    # minus; a currency after it is a whole word (`RM0.02 RM14.20` is RM0.02, not `RM0.02 RM`); printed
    # apart from the amount, a word is a currency only when it is one (`_CURRENCY`): a tax flag
    # (`1.49 T`, `33.99 -A`), a lone `*` or `#` (`1.99 *`) or a label (`Paid 0.28`) is not; glued to
    # it, up to four non-digits are part of the printed word and kept (`55.00S`, `Eur154,40`); `%` is
    # never a currency (`7.75%`, `% 0.00` are rates)
    # …or a whole amount in a currency printed without cents (`¥850`, `850円`, `Rp 25000`, `NT$120`)
    "money": re.compile(
        rf"[-(]?(?:[^\d\s%]{{1,4}}|{_CURRENCY}\s)?{_AMOUNT_DIGITS}"
        rf"(?:(?:\s(?![*#]+(?!\S)){_CURRENCY}|[^\d\s%]{{1,4}})(?!\S))?-?\)?"
        rf"|-?(?:{_WHOLE_BEFORE})\s?\d+(?![\d.,]?\d)|\d+\s?(?:{_WHOLE_AFTER})(?!\S)"
    ),
    "phone": re.compile(r"\+?\(?\d[\d\s().-]{5,}\d"),
}
TOP_STARTS = 8  # the copy head's likeliest starts a typed value is looked for in


_NUMBERS = re.compile(r"(\d{1,4})[/.-](\d{1,2})(?:[/.-](\d{2,4}))?")  # a date's numbers: 12/30[/2016]


def _on_the_calendar(date: str) -> bool:
    """Whether the date's numbers (`12/30/2016` in `Thu 12/30/2016`) name a day: a day 1-31 and a
    month 1-12 in either order (`30/12/16`, `12/30/16`, `04/11`), or a four-digit year first and then
    a month (`2013/05`, `2016-12-30`). `53/1`, `050/00` and `00/15/14` are numbers with slashes. A
    date that names its month (`Jul19'14`) or is compact (`20180428`, which the pattern checks) has
    no such numbers."""
    numeric = _NUMBERS.search(date)
    if numeric is None:
        return True
    first, second, third = numeric.groups()
    a, b = int(first), int(second)
    if len(first) == 4:  # year, month[, day]
        return 1 <= b <= 12 and (third is None or 1 <= int(third) <= 31)
    return len(first) <= 2 and ((1 <= a <= 31 and 1 <= b <= 12) or (1 <= a <= 12 and 1 <= b <= 31))


_AMOUNT = re.compile(r"[-+]?\d+[.,]\d{2}")  # `14000.00`
_DATED = re.compile(r"(?:(?:19|20)\d{2}[/.-]\d{1,2}[/.-]\d{1,2}|\d{1,2}[/.-]\d{1,2}[/.-](?:19|20)\d{2})(?!\S)")


def _match(kind: str, text: str, pos: int = 0, full: bool = False) -> re.Match | None:
    """The type's pattern matched at `pos` (all of `text` with `full`), refused where the value is
    something else. A date must be on the calendar (`_on_the_calendar`); one of two numbers alone is
    not two one-digit numbers (`1/2`, `2-4`: a fraction, a range) and must stand apart from what
    follows it: not glued to a word (`12/30St`) nor the head of a longer run of numbers (`1-01` of
    `1-01-0-01-007797`); a date with its year glued to a label (`21/05/2018TIME`) is still one. A phone
    number is not an amount (`14000.00`) nor a date with its year (`2018-03-31`, `22-11-2014 20`)."""
    pattern = VALUE_TYPES[kind]
    found = pattern.fullmatch(text) if full else pattern.match(text, pos)
    if found is None:
        return None
    value = found.group()
    if kind == "phone" and (_AMOUNT.fullmatch(value) or _DATED.match(value)):
        return None
    if kind == "date" and not _on_the_calendar(value):
        return None
    two = _NUMBERS.fullmatch(value) if kind == "date" else None
    if two and two.group(3) is None and len(two.group(1)) == len(two.group(2)) == 1:
        return None  # `1/2`, `3/4`: a fraction
    if two and two.group(3) is None:
        after = text[found.end() : found.end() + 2]
        if after[:1].isalpha() or re.match(r"[/.-]\d", after):
            return None
    return found


def check_type(name: str) -> str:
    """`name` if it is a known value type, else ValueError naming the known ones."""
    if name not in VALUE_TYPES:
        raise ValueError(f"unknown value type {name!r} (known: {', '.join(VALUE_TYPES)}, or {NO_TYPE})")
    return name


# A key's name that plainly says its kind implies its type (results/prereg-implied-types.md): the
# default keys and keys a user writes plainly (`date`, `total`, `phone_number`) answer a value of
# their kind, as if typed. `date:text` keeps a key untyped; a `Key` built in Python keeps its type.
NO_TYPE = "text"
_PHONE_WORDS = {"tel", "phone", "telephone", "fax", "mobile"}
_OTHER_WORDS = {  # the key is about something other than the value itself: `tax rate`, `invoice number`
    *("id", "no", "nr", "num", "number", "code", "ref", "reference", "rate", "percent", "pct", "count"),
    *("qty", "quantity", "items", "name", "type", "method", "mode", "currency", "zone", "status"),
    *("digits", "label", "description", "weight", "points"),
}
_MONEY_WORDS = {
    *("total", "subtotal", "tax", "taxes", "tip", "tips", "gratuity", "amount", "price", "discount"),
    *("vat", "gst", "hst", "balance", "change", "cash", "fee", "fees", "cost", "charge", "deposit"),
    *("rounding", "surcharge", "paid"),
}
_NAME_WORDS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")  # snake, kebab, camelCase, spaces


def implied_type(name: str) -> str | None:
    """The value type a key's name plainly says (`date`, `due_date`: date; `time`; `total`,
    `taxAmount`, an item's `price`: money; `tel`, `phone number`: phone), else None (`company`,
    `tax_rate`, `invoice_no`, `total_items`, `date_time`)."""
    words = {w.lower() for w in _NAME_WORDS.findall(name)}
    if words & _PHONE_WORDS:
        return "phone"
    if words & _OTHER_WORDS:
        return None
    if "date" in words or "time" in words:
        return None if {"date", "time"} <= words else ("date" if "date" in words else "time")
    return "money" if words & _MONEY_WORDS else None


def is_typed(kind: str, value: str | None) -> bool:
    """True when all of `value` is a value of type `kind`."""
    return value is not None and _match(kind, value.strip(), full=True) is not None


def amount_cents(value: str | None) -> int | None:
    """A money value's amount in cents (`$1,234.56` -> 123456, `12,00 EUR` -> 1200, `-5.00` and
    `(5.00)` -> -500), None when the value is not money. The last `.` or `,` is the decimal mark when
    one or two digits follow it (`224,400` is two hundred twenty-four thousand four hundred); other
    separators group thousands."""
    if not is_typed("money", value):
        return None
    text = value.strip()
    number = re.search(r"\d[\d,.\s']*", text).group().rstrip(",. '")
    whole, cents = number, "0"
    mark = re.search(r"[.,](\d{1,2})$", number)
    if mark:
        whole, cents = number[: mark.start()], mark.group(1).ljust(2, "0")
    amount = int(re.sub(r"\D", "", whole) or "0") * 100 + int(cents)
    negative = text.startswith(("-", "(")) or text.endswith(("-", ")")) or re.search(r"-\s?\d", text)
    return -amount if negative else amount


def reject(kind: str | None, value: str | None) -> str | None:
    """The value when it is of its type (kind None: any value); else its longest beginning, cut
    between words, that is (`1.49 T` -> `1.49`, `30/12/2016 13:45` -> `30/12/2016`: a value read one
    word too far); else None (`unknown`)."""
    if kind is None or value is None or is_typed(kind, value):
        return value
    text = value.strip()
    cuts = [m.start() for m in re.finditer(r"\s+", text)]
    return next((text[:c] for c in reversed(cuts) if is_typed(kind, text[:c])), None)


def reject_untyped(pred: dict, schema) -> dict:
    """A decoder's results for one document with every typed key's value that is not of its type
    made unknown, a list's typed fields item by item (what `Decoder.__call__` does last, after
    snapping, for every decoder)."""

    def checked(r, kind):
        kept = reject(kind, r.value) if r is not None else None
        if r is None or kept == r.value:
            return r
        return replace(r, value=kept, truncated=False) if kept is None else replace(r, value=kept)

    out = dict(pred)
    for k in schema:
        if k.name in out:
            out[k.name] = checked(out[k.name], k.type)
    for g in schema.groups:
        typed = {f.name: f.type for f in g.fields if f.type}
        lst = out.get(g.name)
        if typed and lst is not None:
            items = [{n: checked(r, typed.get(n)) for n, r in it.items()} for it in lst.items]
            out[g.name] = replace(lst, items=items)
    return out


def typed_start(
    kind: str, decode, stream_ids: torch.Tensor, lines: torch.Tensor, p_start: torch.Tensor
) -> tuple[int, int, float] | None:
    """(start, tokens, probability) of the likeliest of the copy head's `TOP_STARTS` starts whose
    rest of the line begins with a value of type `kind` (`decode`: token ids -> text); None when
    none does."""
    if len(p_start) == 0:
        return None
    from pipkie.decoding.items import line_end  # torch-level code; this module is read by the schema

    for m in p_start.topk(min(TOP_STARTS, len(p_start))).indices.tolist():
        if p_start[m] <= 0:  # a start ruled out (a list's field off its item's line: `decoding.items`)
            break
        rest = stream_ids[m : line_end(lines, m)].tolist()
        text = decode(rest)
        lead = len(text) - len(text.lstrip())
        found = _match(kind, text, lead)
        if found is None:
            continue
        n = next(j for j in range(1, len(rest) + 1) if len(decode(rest[:j])) >= found.end())
        return m, n, float(p_start[m])
    return None
