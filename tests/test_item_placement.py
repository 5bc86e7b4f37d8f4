"""pipkie.decoding.items: a list's fields read off the copy head line by line, word by word."""

import pytest
import torch

from pipkie.decoding.items import STOP_P, ItemPlacer, Placement, read_on, stream_lines
from pipkie.model.template import FieldSlots

# a document of two lines, as copy-stream positions (the line break token at 13 is not in the stream)
#   line 0: "Apple" "pie" "12" ",00"    line 1: "Tea" "3" ",50"
# ids: 1xx word-initial tokens, 2xx continuations ("Tea" is written without a leading space)
POS = torch.tensor([0, 1, 2, 3, 5, 6, 7])
IDS = torch.tensor([101, 102, 103, 203, 204, 105, 205])
WORD_INITIAL = {101, 102, 103, 105}


def field(item: int, name: str) -> FieldSlots:
    return FieldSlots(f"items[{item}].{name}", 0, 4, group="items", item=item, field=name)


def one_hot(m: int, n: int = 7) -> torch.Tensor:
    p = torch.full((n,), 0.01)
    p[m] = 1.0
    return p / p.sum()


def lengths(best: int, n: int = 7, k: int = 4) -> torch.Tensor:
    p = torch.full((n, k), 0.01)
    p[:, best - 1] = 1.0
    return p / p.sum(-1, keepdim=True)


def test_lines_are_the_gaps_in_the_stream():
    assert stream_lines(POS).tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert stream_lines(torch.tensor([], dtype=torch.long)).tolist() == []


def test_a_start_inside_a_word_moves_to_its_first_token():
    placer = ItemPlacer(POS, IDS, WORD_INITIAL)
    assert placer.word_start(3) == 2  # ",00" continues "12"
    assert placer.word_start(4) == 4  # "Tea" has no leading space but starts line 1
    assert placer.word_end(2) == 3


def test_an_items_later_fields_start_on_its_first_fields_line_outside_it():
    placer = ItemPlacer(POS, IDS, WORD_INITIAL)
    name = placer.place(field(0, "name"), one_hot(0), lengths(2))  # "Apple"
    assert (name.start, name.back, name.line_end) == (0, 0, 4)
    allow = placer.allow(field(0, "price"))
    assert allow.tolist() == [False, True, True, True, False, False, False]  # line 0, past the name's word
    price = placer.place(field(0, "price"), one_hot(3) * allow, lengths(1))  # argmax inside "12,00"
    assert (price.start, price.back) == (2, 1)  # moved back to "12"


def test_the_next_item_starts_after_the_previous_items_word_and_falls_to_the_next_line():
    placer = ItemPlacer(POS, IDS, WORD_INITIAL)
    placer.place(field(0, "name"), one_hot(0), lengths(2))
    assert placer.allow(field(1, "name")).tolist() == [False, True, True, True, True, True, True]
    placer.place(field(1, "name"), one_hot(4), lengths(1))  # "Tea" on line 1
    assert placer.allow(field(1, "price")).tolist() == [False] * 5 + [True, True]  # line 1 past "Tea"
    placer2 = ItemPlacer(POS, IDS, WORD_INITIAL)
    placer2.place(field(0, "name"), one_hot(2), lengths(2))  # "12,00", the last word of line 0
    placer2.previous.clear()
    allow = placer2.allow(field(0, "price"))
    assert allow.tolist() == [True, True, False, False, False, False, False]  # the rest of line 0
    placer2.anchor[("items", 0)] = (0, 0, 4)  # a name that takes all of line 0
    assert placer2.allow(field(0, "price")).tolist() == [False] * 4 + [True] * 3  # the next line


def test_past_the_last_word_nothing_is_left():
    placer = ItemPlacer(POS, IDS, WORD_INITIAL)
    placer.place(field(0, "name"), one_hot(5), lengths(1))  # "3,50": the document's last word
    assert placer.allow(field(1, "name")) is None
    assert placer.place(field(1, "name"), one_hot(6), lengths(1)).ended
    toks = torch.tensor([9, 8, 7, 6])
    assert placer.write_span(toks, torch.ones(4), 0, 4, Placement(0, ended=True), torch.zeros(4), 0)
    assert toks.tolist() == [0, 0, 0, 0]  # no more items


def test_a_copied_span_replaces_the_slots_answer_with_its_probability():
    end, placer = 0, ItemPlacer(POS, IDS, WORD_INITIAL)
    toks, conf = torch.tensor([9, end, end, end]), torch.tensor([0.5, 0.5, 0.9, 0.9])
    place = Placement(start=2, back=1, line_end=4, p_start=0.8, p_len=torch.tensor([0.8, 0.1, 0.05, 0.05]))
    assert placer.write_span(toks, conf, 0, 4, place, torch.tensor([0.1, 0.1, 0.1, 0.1]), end)
    assert toks.tolist() == [103, 203, end, end]  # one slot + the token moved back over: "12,00"
    assert torch.exp(conf[:3].log().mean()).item() == pytest.approx(0.64 ** (1 / 3))
    long = torch.tensor([9, 8, 7, end])  # three tokens from "12": cut at the line's end
    assert placer.write_span(long, torch.ones(4), 0, 4, place, torch.zeros(4), end)
    assert long.tolist() == [103, 203, end, end]


def test_a_span_that_stops_inside_a_word_takes_the_words_end():
    placer = ItemPlacer(POS, IDS, WORD_INITIAL)
    assert placer.word_ends.tolist() == [0, 1, 3, 3, 4, 6, 6]
    assert placer.word_starts.tolist() == [0, 1, 2, 2, 4, 5, 5]
    place = placer.place(field(0, "price"), one_hot(2), lengths(1))  # "12"
    toks = torch.tensor([103, 0, 0, 0])  # the slots gave one token
    assert placer.write_span(toks, torch.ones(4), 0, 4, place, torch.zeros(4), 0)
    assert toks.tolist() == [103, 203, 0, 0]  # "12,00"


def test_the_slots_answer_stays_when_the_lm_carries_it_or_the_list_ends():
    end, placer = 0, ItemPlacer(POS, IDS, WORD_INITIAL)
    place = Placement(start=2, back=0, line_end=4, p_start=0.8, p_len=torch.full((4,), 0.25))
    toks = torch.tensor([9, 8, end, end])
    assert not placer.write_span(toks, torch.ones(4), 0, 4, place, torch.tensor([0.9, 0.8, 0.5, 0.5]), end)
    assert toks.tolist() == [9, 8, end, end]
    stop = torch.tensor([end, end, end, end])  # "no more items"
    assert not placer.write_span(stop, torch.ones(4), 0, 4, place, torch.zeros(4), end)
    assert stop.tolist() == [end] * 4


def test_an_unsure_no_more_items_reads_the_group_as_an_item():
    """Item 1 says "no more items" at 0.4 (< STOP_P): its fields get their placed words ("Tea", "3,50")
    with their starts' probability; at 0.7 the list ends there, as trained."""
    end = 0
    for p_stop, read in ((STOP_P - 0.1, True), (STOP_P + 0.2, False)):
        placer = ItemPlacer(POS, IDS, WORD_INITIAL)
        placer.place(field(0, "name"), one_hot(0), lengths(1))
        placer.place(field(0, "price"), one_hot(2) * placer.allow(field(0, "price")), lengths(1))
        name = placer.place(field(1, "name"), one_hot(4) * placer.allow(field(1, "name")), lengths(1))
        price = placer.place(field(1, "price"), one_hot(5) * placer.allow(field(1, "price")), lengths(1))
        toks = torch.tensor([101, end, 103, end] + [end] * 4)  # item 0 read; item 1: <|pip_end|> everywhere
        conf = torch.tensor([0.9, 0.9, 0.9, 0.9, p_stop, 0.9, 0.8, 0.9])
        fields = [
            (0, 2, Placement(0), None, placer, field(0, "name")),
            (2, 2, Placement(0), None, placer, field(0, "price")),
        ]
        fields += [(4, 2, name, None, placer, field(1, "name")), (6, 2, price, None, placer, field(1, "price"))]
        read_on(toks, conf, fields, end)
        assert toks[:4].tolist() == [101, end, 103, end]  # the items before are untouched
        assert toks[4:].tolist() == ([204, end, 105, 205] if read else [end] * 4)
        if read:
            assert conf[4].item() == pytest.approx(name.p_start**0.5)  # "Tea" + its end: p^(1/2) each


def test_word_initial_tokens_are_those_with_leading_whitespace():
    from transformers import AutoTokenizer

    from pipkie.model.template import TemplateBuilder

    tok = AutoTokenizer.from_pretrained("models/pipkie")  # the shipped model's (SmolLM2) tokenizer
    b = TemplateBuilder(tok, max_length=128)
    ids = tok("Total 12,00", add_special_tokens=False)["input_ids"]  # "Total", " ", "1", "2", ",", ...
    initial = [i in b.space_ids for i in ids]
    assert not initial[0] and any(initial) and not initial[-1]
    assert ids[1] in b.blank_ids and ids[0] not in b.blank_ids
    placer = ItemPlacer(torch.arange(len(ids)), torch.tensor(ids), b.space_ids, b.blank_ids)
    assert placer.word_start(len(ids) - 1) == 2  # "00" of "12,00" goes back to "1", not to the space
