"""Token length and value coverage statistics."""

from pathlib import Path

import pytest

from pipkie.data.stats import format_table, length_stats, main, value_coverage
from pipkie.io.document import Document, Word

FIXTURES = Path(__file__).parent / "fixtures"


def _docs():
    words = [
        Word("ACME", (0, 0, 100, 10)),
        Word("SDN BHD", (110, 0, 200, 10)),
        Word("TOTAL", (0, 50, 100, 60)),
        Word("12.50", (150, 50, 200, 60)),
        Word("NO. 1, JALAN", (0, 80, 100, 90)),
        Word("AMAN", (0, 95, 100, 105)),
    ]
    return [
        Document(
            id="a",
            words=words,
            fields={
                "company": ["ACME SDN BHD"],
                "total": ["12.50"],
                "address": ["NO. 1, JALAN AMAN"],
                "date": ["01/02/2019"],
            },
        ),
        Document(
            id="b", text="Seller: ACME TRAD1NG SDN BHD\nTotal due: 7.0O", fields={"company": ["ACME TRADING SDN BHD"]}
        ),
    ]


def test_value_coverage():
    cov = value_coverage(_docs())
    assert cov["company"] == {"n": 2, "verbatim": 0.5, "normalized": 0.5, "fuzzy": 1.0}  # OCR error "TRAD1NG"
    assert cov["address"]["verbatim"] == 0.0 and cov["address"]["normalized"] == 1.0  # spans two lines
    assert cov["total"] == {"n": 1, "verbatim": 1.0, "normalized": 1.0, "fuzzy": 1.0}
    assert cov["date"]["fuzzy"] == 0.0
    assert set(value_coverage(_docs(), keys=["total"])) == {"total"}


def test_length_stats_with_any_tokenizer():
    stats = length_stats(_docs(), str.split, keys=["total", "company", "missing"])
    assert stats["documents"]["n"] == 2 and stats["documents"]["max"] == 9
    assert stats["values"]["company"] == {"n": 2, "mean": 3.5, "p50": 3, "p95": 4, "max": 4}
    assert stats["values"]["total"]["n"] == 1 and stats["values"]["missing"]["n"] == 0
    assert set(length_stats(_docs(), str.split)["values"]) == {"company", "total", "address", "date"}


def test_table_and_main(capsys):
    assert format_table(["key", "n"], [["a", 1]]).splitlines() == ["key  n", "---  -", "a    1"]
    main(["--dataset", "funsd", "--data-dir", str(FIXTURES / "funsd"), "--split", "train"])
    out = capsys.readouterr().out
    assert "funsd train: 2 documents" in out and "NAME" in out and "fuzzy>=90" in out
    with pytest.raises(SystemExit):
        main(["--dataset", "nope", "--data-dir", "x"])
