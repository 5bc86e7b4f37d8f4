"""Key names as users write them: synonyms, casing, descriptions, and budgets, for training templates.

A model that only ever saw `total` must also answer `Total Amount`, `amount_paid` or `grand total`,
and a key with a description (`"total (the final amount paid)"`). `sample_schemas` turns a labelled
document's fields (canonical names such as `store_name`) into answer templates whose keys are
drawn from `ALIASES`, written in a random style (snake_case, camelCase, Title Case, UPPER, spaced),
sometimes with a description, plus keys the document does not have (answered `unknown`). It
returns each template with the values under the names it used.

Budgets (`BUDGETS`, slots per canonical key) are drawn around what a value needs, so the model
learns to stop by itself whatever the number of slots (the copy head predicts a value's length).
"""

from __future__ import annotations

import random
import re

from pipkie.model.groups import span_slots
from pipkie.schema import Key, KeySchema
from pipkie.train.instances import ABSENT_KEYS

ALIASES: dict[str, tuple[str, ...]] = {
    "store_name": (
        "company",
        "store_name",
        "store name",
        "merchant",
        "merchant name",
        "vendor",
        "shop name",
        "business name",
        "seller",
        "store",
    ),
    "company": ("company", "company name", "store name", "merchant", "vendor", "seller", "business name"),
    "store_addr": (
        "address",
        "store_addr",
        "store address",
        "merchant address",
        "shop address",
        "location",
        "business address",
    ),
    "address": ("address", "store address", "company address", "merchant address", "seller address"),
    "tel": ("tel", "phone", "telephone", "phone number", "tel no", "contact number", "store phone"),
    "date": ("date", "purchase date", "transaction date", "receipt date", "date of purchase", "txn date"),
    "time": ("time", "transaction time", "purchase time", "time of purchase", "receipt time"),
    "subtotal": ("subtotal", "sub total", "net amount", "amount before tax", "subtotal amount"),
    "tax": ("tax", "tax amount", "vat", "sales tax", "gst", "vat amount", "tax total"),
    "tips": ("tips", "tip", "gratuity", "tip amount"),
    "discount": ("discount", "savings", "coupon", "discount amount"),
    "total": ("total", "total amount", "amount paid", "grand total", "amount due", "total paid", "total price"),
    "receipt_number": (
        "receipt number",
        "receipt no",
        "transaction number",
        "bill number",
        "check number",
        "order number",
        "ticket number",
    ),
    "cashier": ("cashier", "server", "cashier name", "served by", "clerk"),
    "payment_method": ("payment method", "payment type", "paid by", "card type", "tender type"),
    "card_last4": ("card last digits", "last 4 digits", "card number", "card last4"),
    "cash": ("cash", "cash tendered", "amount tendered", "cash given"),
    "change": ("change", "change due", "change given"),
    "vendor": ("vendor", "seller", "supplier", "company", "vendor name", "issuer"),
    "vendor_address": ("vendor address", "seller address", "supplier address", "address"),
    "vendor_tel": ("vendor phone", "phone", "tel", "supplier phone"),
    "vat_id": ("vat id", "vat number", "tax id", "vat no", "tax number"),
    "invoice_number": ("invoice number", "invoice no", "invoice id", "bill number", "document number"),
    "invoice_date": ("invoice date", "date", "issue date", "date of issue", "billing date"),
    "due_date": ("due date", "payment due", "due", "pay by date"),
    "customer": ("customer", "bill to", "client", "customer name", "buyer"),
    "customer_address": ("customer address", "billing address", "client address", "bill to address"),
    "party": ("party", "parties", "party names", "contracting parties"),
    "jurisdiction": ("jurisdiction", "governing law", "governing state", "jurisdiction state"),
    "effective_date": ("effective date", "effective_date", "start date", "date effective", "commencement date"),
    "term": ("term", "contract term", "duration", "agreement term"),
}

DESCRIPTIONS: dict[str, tuple[str, ...]] = {
    "store_name": ("the name of the store or restaurant", "who issued the receipt"),
    "company": ("the company that issued the receipt", "the seller's name"),
    "store_addr": ("where the store is", "street, city and postcode of the store"),
    "address": ("the seller's address", "where the store is"),
    "tel": ("the store's phone number",),
    "date": ("the day of the purchase", "when the receipt was issued"),
    "time": ("the time of day of the purchase", "hours and minutes on the receipt"),
    "subtotal": ("the amount before tax", "the sum of the items"),
    "tax": ("the tax charged", "VAT or sales tax amount"),
    "tips": ("the tip added", "gratuity"),
    "discount": ("the amount taken off",),
    "total": ("the final amount paid", "what the customer paid, tax included", "the total amount"),
    "receipt_number": ("the receipt's reference number",),
    "cashier": ("who served the customer",),
    "payment_method": ("how it was paid: cash or card brand",),
    "card_last4": ("the last digits of the card",),
    "invoice_number": ("the invoice's reference number",),
    "due_date": ("when payment is due",),
    "customer": ("who is billed",),
    "party": ("the parties to the agreement",),
    "jurisdiction": ("the state or country whose law governs",),
    "effective_date": ("the date the agreement takes effect",),
    "term": ("how long the agreement lasts",),
}

BUDGETS: dict[str, int] = {
    "store_name": 24,
    "company": 24,
    "store_addr": 64,
    "address": 64,
    "vendor_address": 48,
    "customer_address": 48,
    "vendor": 24,
    "customer": 24,
    "party": 48,
    "tel": 16,
    "vendor_tel": 16,
    "date": 16,
    "invoice_date": 16,
    "due_date": 16,
    "effective_date": 16,
    "time": 12,
    "term": 16,
    "jurisdiction": 12,
    "receipt_number": 16,
    "invoice_number": 16,
    "vat_id": 16,
    "cashier": 12,
    "payment_method": 12,
    "card_last4": 8,
}
DEFAULT_BUDGET = 16
MAX_BUDGET = 64
_WORDS = re.compile(r"[A-Za-z0-9]+")


def styled(name: str, rng: random.Random) -> str:
    """The name in a random style: as written, snake_case, camelCase, Title Case, UPPER or lower."""
    words = _WORDS.findall(name)
    if not words:
        return name
    style = rng.random()
    if style < 0.35:
        return name
    if style < 0.55:
        return "_".join(w.lower() for w in words)
    if style < 0.7:
        return words[0].lower() + "".join(w.title() for w in words[1:])
    if style < 0.85:
        return " ".join(w.title() for w in words)
    if style < 0.93:
        return " ".join(w.upper() for w in words)
    return " ".join(w.lower() for w in words)


def surface(canonical: str, rng: random.Random, variation: float) -> str:
    """A name a user might give the canonical key (the canonical name itself with 1 - variation)."""
    if rng.random() >= variation or canonical not in ALIASES:
        return canonical
    return styled(rng.choice(ALIASES[canonical]), rng)


def sample_schemas(
    fields: dict[str, str],
    rng: random.Random,
    n: int,
    *,
    absent_pool: tuple[str, ...] = (),
    variation: float = 0.5,
    describe: float = 0.2,
    key_dropout: float = 0.3,
    absent: float = 0.5,
    max_keys: int = 6,
    value_len=None,
    ask_missing: float = 0.0,
    erased: tuple[str, ...] = (),
    always_ask: tuple[str, ...] = (),
) -> list[tuple[KeySchema, dict[str, str | None]]]:
    """n (schema, values) templates over a document's fields (canonical name -> value or None).

    Keys are subsets of the present ones (at most `max_keys`), named by `surface`, described with
    probability `describe`; with probability `absent` a template also asks for a key the document
    lacks (from `absent_pool` and ABSENT_KEYS), whose value is None (`unknown`). `value_len(text)`
    gives a value's token count, so that its budget always holds it.

    `ask_missing`: each key of `absent_pool` the document lacks is also asked, as a present key is,
    with probability `ask_missing * (1 - key_dropout)`: a user asks the same keys of every receipt,
    and the model's prior for "this receipt has no address" should be the documents' own (at 0, a
    missing key is asked only through `absent`, ~1 template in 20 for a given key: the model learnt
    that an address is always there). At 0 no draw changes.

    `erased`: keys whose value was taken out of the document (`pipkie.train.erase`): asked as present
    keys are, valued None.

    `always_ask`: keys asked in every template where the document has them, never dropped nor cut by
    `max_keys` (a key asked in one template of five is trained less than the keys around it). Tried
    on the store name in round 32: it halved the store name's drift, not significantly
    (docs/RESULTS.md "Rounds 32 and 33"). Empty: no draw changes."""
    present = [k for k, v in fields.items() if v] + [k for k in erased if not fields.get(k)]
    missing = [k for k in absent_pool if k not in fields or not fields[k]]
    out = []
    for _ in range(n):
        chosen = [k for k in present if rng.random() >= key_dropout]
        if ask_missing:
            chosen += [k for k in missing if rng.random() < ask_missing * (1 - key_dropout)]
        chosen = chosen or ([rng.choice(present)] if present else [])
        rng.shuffle(chosen)
        if always_ask:  # first, so that max_keys never cuts them; then shuffled again
            kept = [k for k in always_ask if k in present]
            chosen = (kept + [k for k in chosen if k not in kept])[:max_keys]
            rng.shuffle(chosen)
        chosen = chosen[:max_keys]
        if rng.random() < absent or not chosen:
            pool = missing if missing and rng.random() < 0.7 else list(ABSENT_KEYS)
            chosen.insert(rng.randrange(len(chosen) + 1), rng.choice(pool))
        keys, values, names = [], {}, set()
        for canonical in chosen:
            name = surface(canonical, rng, variation)
            if name.lower() in names:  # two canonical keys drew the same alias: keep the canonical name
                name = canonical
            if name.lower() in names:
                continue
            names.add(name.lower())
            desc = (
                rng.choice(DESCRIPTIONS[canonical]) if canonical in DESCRIPTIONS and rng.random() < describe else None
            )
            value = fields.get(canonical)
            base = BUDGETS.get(canonical, DEFAULT_BUDGET)
            budget = rng.choice((base, base, DEFAULT_BUDGET, 24, int(base * 1.5)))
            if value and value_len is not None:
                budget = max(budget, value_len(value) + 1)
            keys.append(Key(name, desc, min(MAX_BUDGET, budget)))
            values[name] = value
        out.append((KeySchema(tuple(keys)), values))
    return out


# ---- lists of items (pipkie.model.groups) ---------------------------------------------------------------
ITEM_FIELDS = ("name", "quantity", "unit_price", "price")  # = pipkie.data.receipts.ITEM_FIELDS
LIST_NAMES = ("items", "line items", "products", "lines", "articles", "purchases", "order lines", "positions")
ITEM_ALIASES: dict[str, tuple[str, ...]] = {
    "name": ("name", "description", "product", "item", "item name", "article", "product name"),
    "quantity": ("quantity", "qty", "count", "units", "amount ordered"),
    "unit_price": ("unit price", "unit_price", "price each", "unit cost", "rate"),
    "price": ("price", "amount", "line total", "total price", "cost"),
}
ITEM_BASE_BUDGETS = {"name": 16, "quantity": 6, "unit_price": 10, "price": 10}


def item_alias_budgets(base_budgets: dict[str, int]) -> dict[str, int]:
    """Slots by field name for every alias of a canonical item field (`ITEM_ALIASES`): what a model
    trained with `base_budgets` saves as its `item_budgets`, so that `qty` gets quantity's."""
    return {a: n for c, n in base_budgets.items() for a in (c, *ITEM_ALIASES.get(c, ()))}


MAX_TEMPLATE_ITEMS = 48


def document_items(doc) -> list[dict[str, str | None]]:
    """A document's line items (`Document.items` over the `items.<field>` columns it has)."""
    return doc.items({f: f"items.{f}" for f in ITEM_FIELDS if f"items.{f}" in doc.fields})


def sample_item_schema(
    fields: dict[str, str | None],
    items: list[dict],
    rng: random.Random,
    *,
    room: int,
    value_len,
    variation: float = 0.5,
    describe: float = 0.2,
    key_dropout: float = 0.3,
    absent: float = 0.5,
    absent_pool: tuple[str, ...] = (),
    ask_missing: float = 0.0,
    always_ask: tuple[str, ...] = (),
    base_budgets: dict[str, int] | None = None,
    item_slots: int = 0,
):
    """One (schema, values) template that asks for the document's line items: a list named like a
    user would (`LIST_NAMES`, fields from `ITEM_ALIASES`; the item's name is nearly always asked for
    and first most of the time, since a list's first field says "no more items"), with half the time
    a few flat keys (`sample_schemas`). The list's maxItems is the number of items or a few more (so
    that surplus groups learn to say "no more items"), cut to what fits in `room` template tokens
    (`value_len` counts tokens; then only the first items are targets). A field's slots: its base
    budget (`base_budgets` by canonical field, over `ITEM_BASE_BUDGETS`) or 1.5 times it, at least
    its longest value + 1. `item_slots` > 0: a field takes at most that many slots in the template
    (a span field, `pipkie.model.groups`), so more items fit in `room`."""
    from pipkie.schema import Group

    bases = {**ITEM_BASE_BUDGETS, **(base_budgets or {})}

    flat, flat_values = (), {}
    if rng.random() < 0.5:
        ((schema, flat_values),) = sample_schemas(
            fields,
            rng,
            1,
            absent_pool=absent_pool,
            variation=variation,
            describe=describe,
            key_dropout=key_dropout,
            absent=absent,
            max_keys=3,
            value_len=value_len,
            ask_missing=ask_missing,
            always_ask=always_ask,
        )
        flat = schema.keys
    have = [f for f in ITEM_FIELDS if items and f in items[0]]
    chosen = [f for f in have if f != "name" and rng.random() < 0.6]
    if "name" in have and (rng.random() < 0.95 or not chosen):
        chosen.insert(0 if rng.random() < 0.8 else rng.randrange(len(chosen) + 1), "name")
    if not chosen:
        chosen = have[:1]
    list_name = styled(rng.choice(LIST_NAMES), rng) if rng.random() < variation else "items"
    if list_name.lower() in {k.name.lower() for k in flat}:
        list_name = "line_items_list"
    keys, names = [], {}
    for canonical in chosen:
        name = styled(rng.choice(ITEM_ALIASES[canonical]), rng) if rng.random() < variation else canonical
        if name.lower() in {k.name.lower() for k in keys}:
            name = canonical
        lens = [value_len(it[canonical]) + 1 for it in items if it.get(canonical)]
        base = bases[canonical]
        budget = min(MAX_BUDGET, max([rng.choice((base, base, int(base * 1.5)))] + lens))
        keys.append(Key(name, None, budget))
        names[canonical] = name
    k = min(MAX_TEMPLATE_ITEMS, len(items) + rng.choice((0, 1, 1, 2, 3, 5, 8)))
    flat_len = sum(value_len(key.name) + 2 + (key.max_tokens or DEFAULT_BUDGET) for key in flat)
    per_item = sum(
        value_len(f"{list_name} {k} {key.name}:") + 1 + span_slots(key.max_tokens, item_slots) for key in keys
    )
    k = max(1, min(k, (room - flat_len) // per_item))
    values = dict(flat_values)
    values[list_name] = [{names[c]: it.get(c) for c in chosen} for it in items]
    return KeySchema(tuple(flat), (Group(list_name, tuple(keys), k),)), values
