"""How receipts and invoices print things in different countries: money, dates, times, phones, labels.

A `Locale` bundles what varies: the Faker locale for names and addresses, currencies (symbol or
code, before or after the amount, glued or spaced), the decimal separator, date/time/phone formats
and the labels printed next to each value (`TOTAL`, `Summe`, `Total TTC`, ...). The synthetic
generators (`pipkie.data.receipts`) draw one locale per document, so a model trained on them sees
`12/30/2016`, `30.12.16`, `2016-12-30` and `30 Dec 2016`; `$60.44`, `Eur154,40` and `60.44 €`.

Date formats use `str.format` fields: d/m (day/month numbers), dd/mm (zero-padded), Y (year),
y (two-digit year), b (month abbreviation), B (month name), a (weekday abbreviation).
Phone patterns: `#` is a digit.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import date, timedelta

MONTHS = "January February March April May June July August September October November December".split()
WEEKDAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()

# Labels shared by the English-speaking locales; others override some of them.
EN_LABELS = {
    "total": (
        "TOTAL",
        "Total",
        "GRAND TOTAL",
        "Total Due",
        "AMOUNT DUE",
        "BALANCE DUE",
        "Total Amount",
        "TOTAL SALE",
        "Amount",
        "TOTAL USD",
    ),
    "subtotal": ("SUBTOTAL", "Subtotal", "Sub-Total", "SUB TOTAL", "Net Total", "Merchandise"),
    "tax": ("TAX", "Tax", "Sales Tax", "SALES TAX", "VAT", "GST", "HST", "Tax 1"),
    "tips": ("TIP", "Tip", "Gratuity", "TIPS"),
    "discount": ("DISCOUNT", "Discount", "Savings", "COUPON", "Promo"),
    "date": ("DATE", "Date", "Date:", "Trans Date"),
    "time": ("TIME", "Time", "Time:"),
    "tel": ("TEL", "Tel:", "Phone:", "PHONE", "Ph:", "T:"),
    "receipt_number": ("Receipt #", "RECEIPT NO", "Check #", "Order #", "Trans #", "Ticket:", "INVOICE NO"),
    "cashier": ("Cashier:", "CASHIER", "Server:", "Served by", "Operator:", "Clerk:"),
    "change": ("CHANGE", "Change", "Change Due"),
    "cash": ("CASH", "Cash", "Tendered", "AMOUNT TENDERED"),
    "card": ("VISA", "MASTERCARD", "AMEX", "DEBIT", "CREDIT CARD", "Card"),
    "items": ("ITEMS", "Items", "Item Count", "No. of items"),
    "thanks": (
        "THANK YOU!",
        "Thank you for shopping with us",
        "THANK YOU, COME AGAIN",
        "Have a nice day!",
        "Please retain receipt for returns",
        "Visit us online",
    ),
    "vat_id": ("VAT No:", "VAT Reg No", "Tax ID:", "ABN", "GST REG #"),
    "invoice": ("INVOICE", "Invoice", "TAX INVOICE", "BILL"),
    "due": ("Due Date:", "Payment due", "Due:", "Pay by"),
    "bill_to": ("Bill To:", "BILL TO", "Customer:", "Sold To:", "Invoice to:"),
}


@dataclass(frozen=True)
class Locale:
    name: str
    faker: str
    currencies: tuple[str, ...]  # printed before/after amounts, or not at all
    decimal: str = "."
    thousands: str = ","
    symbol_before: bool = True
    date_formats: tuple[str, ...] = ()
    time_formats: tuple[str, ...] = (
        "{H:02d}:{M:02d}",
        "{H:02d}:{M:02d}:{S:02d}",
        "{h}:{M:02d} {p}",
        "{h:02d}:{M:02d}{p}",
    )
    phones: tuple[str, ...] = ()
    tax_rates: tuple[float, ...] = (0.0,)
    labels: dict = field(default_factory=dict)

    def label(self, what: str, rng: random.Random) -> str:
        return rng.choice(self.labels.get(what) or EN_LABELS[what])


def _labels(**over) -> dict:
    return {**EN_LABELS, **over}


LOCALES: dict[str, Locale] = {
    loc.name: loc
    for loc in (
        Locale(
            "us",
            "en_US",
            ("$", "", "", "USD"),
            date_formats=(
                "{mm}/{dd}/{Y}",
                "{mm}/{dd}/{y}",
                "{m}/{d}/{Y}",
                "{b} {d}, {Y}",
                "{mm}-{dd}-{Y}",
                "{mm}/{dd}/{Y} {a}",
                "{a} {b} {dd} {Y}",
                "{b}{d}'{y}",
                "{Y}-{mm}-{dd}",
            ),
            phones=("(###) ###-####", "###-###-####", "###.###.####", "(###)###-####"),
            tax_rates=(0.0625, 0.08, 0.0725, 0.09, 0.1025),
            labels=_labels(tax=("TAX", "Sales Tax", "SALES TAX", "Tax 1", "TX")),
        ),
        Locale(
            "ca",
            "en_CA",
            ("$", "", "CAD"),
            date_formats=("{Y}-{mm}-{dd}", "{dd}/{mm}/{Y}", "{b} {d}, {Y}", "{mm}/{dd}/{y}"),
            phones=("(###) ###-####", "###-###-####"),
            tax_rates=(0.05, 0.13, 0.15),
            labels=_labels(tax=("GST", "HST", "PST", "GST/HST", "TAX")),
        ),
        Locale(
            "uk",
            "en_GB",
            ("£", "", "GBP"),
            date_formats=(
                "{dd}/{mm}/{Y}",
                "{dd}/{mm}/{y}",
                "{d} {b} {Y}",
                "{dd}-{b}-{Y}",
                "{a} {d} {B} {Y}",
                "{dd}.{mm}.{y}",
                "{dd}{b}'{y}",
            ),
            phones=("0### ### ####", "0## #### ####", "+44 ## #### ####"),
            tax_rates=(0.2,),
            labels=_labels(
                tax=("VAT", "VAT 20%", "VAT @ 20%", "Tax"),
                total=("TOTAL", "Total", "BALANCE DUE", "Amount Due", "TO PAY"),
            ),
        ),
        Locale(
            "de",
            "de_DE",
            ("€", "EUR", "Eur", ""),
            decimal=",",
            thousands=".",
            symbol_before=False,
            date_formats=("{dd}.{mm}.{Y}", "{dd}.{mm}.{y}", "{d}.{m}.{Y}", "{Y}-{mm}-{dd}", "{dd}.{mm}.{Y} {a}"),
            time_formats=("{H:02d}:{M:02d}", "{H:02d}:{M:02d}:{S:02d}", "{H:02d}:{M:02d} Uhr"),
            phones=("0## ########", "0###-######", "+49 ## ########", "0### / ######"),
            tax_rates=(0.19, 0.07),
            labels=_labels(
                total=("Summe", "SUMME", "Gesamt", "Total", "Zu zahlen", "Gesamtbetrag", "BAR"),
                subtotal=("Zwischensumme", "Netto", "Summe netto", "Nettobetrag"),
                tax=("MwSt", "MwSt 19%", "USt", "19% MwSt", "enth. MwSt"),
                tips=("Trinkgeld",),
                discount=("Rabatt", "Nachlass"),
                date=("Datum", "Datum:"),
                time=("Zeit", "Uhrzeit:"),
                tel=("Tel.", "Tel:", "Telefon"),
                receipt_number=("Beleg-Nr.", "Bon-Nr.", "Rechnung Nr.", "Rechnungsnr."),
                cashier=("Kasse", "Bediener:", "Es bediente Sie:"),
                change=("Rückgeld", "Zurück"),
                cash=("Bar", "Gegeben", "BAR"),
                thanks=("Vielen Dank für Ihren Einkauf", "Danke!", "Auf Wiedersehen"),
                vat_id=("USt-IdNr.", "Steuer-Nr.:", "St.-Nr."),
                invoice=("RECHNUNG", "Rechnung"),
                due=("Fällig am:", "Zahlbar bis:"),
                bill_to=("Rechnungsempfänger:", "Kunde:"),
            ),
        ),
        Locale(
            "fr",
            "fr_FR",
            ("€", "EUR", ""),
            decimal=",",
            thousands=" ",
            symbol_before=False,
            date_formats=("{dd}/{mm}/{Y}", "{dd}/{mm}/{y}", "{dd}-{mm}-{Y}", "{d} {b} {Y}"),
            time_formats=("{H:02d}:{M:02d}", "{H:02d}h{M:02d}", "{H:02d}:{M:02d}:{S:02d}"),
            phones=("0# ## ## ## ##", "+33 # ## ## ## ##"),
            tax_rates=(0.2, 0.1, 0.055),
            labels=_labels(
                total=("TOTAL", "Total TTC", "TOTAL TTC", "Net à payer", "MONTANT"),
                subtotal=("Total HT", "Sous-total", "HT"),
                tax=("TVA", "TVA 20%", "Dont TVA"),
                tips=("Pourboire",),
                discount=("Remise",),
                date=("Date", "Le"),
                time=("Heure",),
                tel=("Tél:", "Tel", "Téléphone"),
                receipt_number=("Ticket n°", "Facture N°", "No"),
                cashier=("Caissier:", "Vendeur:"),
                change=("Rendu", "Monnaie rendue"),
                cash=("Espèces", "ESPECES"),
                thanks=("Merci de votre visite", "A bientôt"),
                vat_id=("N° TVA", "SIRET"),
                invoice=("FACTURE", "Facture"),
                due=("Échéance:",),
                bill_to=("Client:", "Facturé à:"),
            ),
        ),
        Locale(
            "nl",
            "nl_NL",
            ("€", "EUR", ""),
            decimal=",",
            thousands=".",
            date_formats=("{dd}-{mm}-{Y}", "{dd}-{mm}-{y}", "{d} {b} {Y}"),
            phones=("0## ### ####", "+31 ## #######"),
            tax_rates=(0.21, 0.09),
            labels=_labels(
                total=("TOTAAL", "Totaal", "Te betalen"),
                subtotal=("Subtotaal",),
                tax=("BTW", "BTW 21%"),
                date=("Datum",),
                time=("Tijd",),
                tel=("Tel", "Telefoon"),
                change=("Wisselgeld",),
                cash=("Contant",),
                thanks=("Bedankt en tot ziens",),
                vat_id=("BTW-nr", "KvK"),
            ),
        ),
        Locale(
            "it",
            "it_IT",
            ("€", "EUR", ""),
            decimal=",",
            thousands=".",
            symbol_before=False,
            date_formats=("{dd}/{mm}/{Y}", "{dd}-{mm}-{Y}", "{dd}/{mm}/{y}"),
            phones=("0## #######", "+39 ### #######"),
            tax_rates=(0.22, 0.1),
            labels=_labels(
                total=("TOTALE", "Totale", "TOTALE EURO"),
                subtotal=("SUBTOTALE", "Imponibile"),
                tax=("IVA", "IVA 22%"),
                date=("Data",),
                time=("Ora",),
                tel=("Tel.",),
                change=("Resto",),
                cash=("Contanti",),
                vat_id=("P.IVA",),
            ),
        ),
        Locale(
            "es",
            "es_ES",
            ("€", "EUR", ""),
            decimal=",",
            thousands=".",
            symbol_before=False,
            date_formats=("{dd}/{mm}/{Y}", "{dd}-{mm}-{Y}", "{dd}/{mm}/{y}"),
            phones=("### ### ###", "+34 ### ### ###"),
            tax_rates=(0.21, 0.1),
            labels=_labels(
                total=("TOTAL", "Total", "IMPORTE"),
                subtotal=("Base imponible", "Subtotal"),
                tax=("IVA", "IVA 21%"),
                date=("Fecha",),
                time=("Hora",),
                tel=("Tel.", "Teléfono"),
                change=("Cambio",),
                cash=("Efectivo",),
                vat_id=("CIF", "NIF"),
            ),
        ),
        Locale(
            "au",
            "en_AU",
            ("$", "", "AUD"),
            date_formats=("{dd}/{mm}/{Y}", "{dd}/{mm}/{y}", "{d} {b} {Y}", "{dd}-{b}-{y}", "{dd}{b}{Y}"),
            phones=("(0#) #### ####", "0# #### ####", "13 ## ##"),
            tax_rates=(0.1,),
            labels=_labels(tax=("GST", "GST Included", "Incl. GST"), vat_id=("ABN", "ABN:")),
        ),
        Locale(
            "in",
            "en_IN",
            ("Rs.", "₹", "INR", ""),
            date_formats=("{dd}/{mm}/{Y}", "{dd}-{mm}-{Y}", "{dd}-{b}-{Y}", "{dd}/{mm}/{y}"),
            phones=("+91 ##### #####", "0##-########", "##########"),
            tax_rates=(0.05, 0.12, 0.18),
            labels=_labels(
                tax=("GST", "CGST", "SGST", "CGST 2.5%"),
                total=("TOTAL", "Grand Total", "Net Amount", "Bill Amount"),
                vat_id=("GSTIN", "GSTIN:"),
            ),
        ),
        Locale(
            "sg",
            "en_GB",
            ("$", "S$", "SGD", ""),
            date_formats=("{dd}/{mm}/{Y}", "{dd}-{b}-{Y}", "{dd}/{mm}/{y}", "{Y}-{mm}-{dd}"),
            phones=("6### ####", "+65 #### ####", "9### ####"),
            tax_rates=(0.07, 0.09),
            labels=_labels(tax=("GST", "GST 7%", "7% GST", "SVC CHG"), vat_id=("GST Reg No:", "UEN")),
        ),
        Locale(
            "my",
            "en_MS",
            ("RM", ""),
            date_formats=(
                "{dd}/{mm}/{Y}",
                "{dd}-{mm}-{y}",
                "{dd} {b} {Y}",
                "{dd}.{mm}.{Y}",
                "{dd}{b}'{y}",
                "{d}-{b}-{Y}",
            ),
            phones=("0#-#### ####", "01#-### ####", "03-#### ####"),
            tax_rates=(0.06, 0.0),
            labels=_labels(tax=("GST", "SST 6%", "GST @6%", "SERVICE TAX"), vat_id=("GST ID:", "GST REG NO:")),
        ),
    )
}


def money(value: float, loc: Locale, currency: str, *, glued: bool = True) -> str:
    """`value` printed the locale's way, with `currency` (may be "") before or after it."""
    whole, cents = f"{abs(value):.2f}".split(".")
    groups = f"{int(whole):,}".replace(",", loc.thousands) if abs(value) >= 1000 else whole
    text = ("-" if value < 0 else "") + groups + loc.decimal + cents
    if not currency:
        return text
    space = "" if glued else " "
    return f"{currency}{space}{text}" if loc.symbol_before or currency == "$" else f"{text}{space}{currency}"


def random_day(rng: random.Random, first_year: int = 2010, years: int = 15) -> date:
    return date(first_year, 1, 1) + timedelta(days=rng.randrange(years * 365))


def format_date(day: date, fmt: str, rng: random.Random) -> str:
    month, weekday = MONTHS[day.month - 1], WEEKDAYS[day.weekday()]
    upper = rng.random() < 0.5
    b, a = month[:3], weekday[:3]
    if upper:
        b, a, month = b.upper(), a.upper(), month.upper()
    return fmt.format(
        d=day.day,
        m=day.month,
        dd=f"{day.day:02d}",
        mm=f"{day.month:02d}",
        Y=day.year,
        y=f"{day.year % 100:02d}",
        b=b,
        B=month,
        a=a,
    )


def format_time(rng: random.Random, fmt: str) -> str:
    hour, minute, second = rng.randrange(6, 24), rng.randrange(60), rng.randrange(60)
    p = ("AM" if hour < 12 else "PM") if rng.random() < 0.7 else ("am" if hour < 12 else "pm")
    return fmt.format(H=hour, M=minute, S=second, h=(hour - 1) % 12 + 1, p=p)


def phone(loc: Locale, rng: random.Random) -> str:
    pattern = rng.choice(loc.phones or ("###-###-####",))
    return "".join(str(rng.randrange(10)) if ch == "#" else ch for ch in pattern)
