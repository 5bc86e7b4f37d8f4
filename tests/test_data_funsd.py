"""FUNSD reader on the hand-made fixture (official format), and its error paths."""

import json
from pathlib import Path

import pytest

from pipkie.data.errors import DataError
from pipkie.data.funsd import question_key, read_funsd

FIXTURE = Path(__file__).parent / "fixtures" / "funsd"


def test_fixture_forms():
    a, b = read_funsd(FIXTURE, "train")
    assert a.id == "form_a" and a.page_sizes == [(400, 300)] and a.images  # size from the image
    assert a.fields == {"NAME": ["John Smith"], "DATE": ["12/03/1998"]}  # unanswered PHONE left out
    assert [w.text for w in a.words][:3] == ["REGISTRATION", "FORM", "NAME:"]
    assert a.words[0].box == (300, 33, 525, 100)
    assert b.page_sizes == [(200, 140)] and not b.images  # size from the boxes
    assert b.fields == {"TO": ["Dr. A. Jones", "Research Dept."], "DATE": ["May 5, 1987", "May 9, 1987"]}
    assert len(list(read_funsd(FIXTURE, "train", limit=1))) == 1


def test_question_key():
    assert question_key(" Date  of\nBirth : ") == "Date of Birth"


def test_missing_split(tmp_path):
    with pytest.raises(DataError, match="testing_data"):
        list(read_funsd(FIXTURE, "test"))
    with pytest.raises(DataError, match="annotations"):
        list(read_funsd(tmp_path, "train"))


def _form(tmp_path, text):
    ann = tmp_path / "training_data" / "annotations"
    ann.mkdir(parents=True)
    (ann / "bad.json").write_text(text)
    return tmp_path


def test_malformed_json_names_file_and_line(tmp_path):
    _form(tmp_path, '{"form": [\n  {"id": 0,\n  oops}\n]}')
    with pytest.raises(DataError, match=r"bad\.json:3: not JSON"):
        list(read_funsd(tmp_path, "train"))


@pytest.mark.parametrize(
    "form,why",
    [
        ({"entities": []}, "form"),
        ({"form": [{"id": 0, "text": "x", "label": "question"}]}, "box"),
        ({"form": [{"id": 0, "text": "x", "box": [0, 0, 1, 1], "label": "question", "linking": [[0, 7]]}]}, "7"),
    ],
)
def test_malformed_forms(tmp_path, form, why):
    _form(tmp_path, json.dumps(form))
    with pytest.raises(DataError, match=rf"bad\.json: .*{why}"):
        list(read_funsd(tmp_path, "train"))
