"""The decoder registry: one name per decoder everywhere, and a new decoder is one module plus one
registry line (README "Extending pipkie"): the Extractor, evaluate's decode step, bench's methods,
the service's request parsing and the CLI accept it with no other edit."""

from __future__ import annotations

import pytest

from pipkie.decoding import DECODERS, get_decoder
from pipkie.decoding.pip import PipDecoder
from tests.test_extract import tiny_extractor, tiny_model_dir  # noqa: F401


class ShoutingPip(PipDecoder):
    """A toy strategy: PIP, each value marked (what a new decoder module would define)."""

    name = "pip-shout"

    def decode(self, *args, **kw):
        preds = super().decode(*args, **kw)
        for p in preds:
            for f in p.values():
                f.value = f"!{f.value or ''}"
        return preds


SHOUT = ShoutingPip()


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(DECODERS._where, "pip-shout", f"{__name__}:SHOUT")  # the one registry line
    yield SHOUT
    DECODERS._loaded.pop("pip-shout", None)


def test_the_registry_names_each_decoder_once_and_refuses_others():
    assert list(DECODERS) == ["pip", "ar-free", "ar-forced"]
    assert {n: (d.objective, d.refines) for n, d in DECODERS.items()} == {
        "pip": ("pip", True),
        "ar-free": ("ar", False),
        "ar-forced": ("ar", False),
    }
    for bad in ("ar", "beam", "", None, 3):
        with pytest.raises(ValueError, match="choose one of pip, ar-free, ar-forced"):
            get_decoder(bad)


def test_a_registered_decoder_is_accepted_everywhere(registered, tiny_extractor):
    from pipkie.eval.bench import all_methods, method_decoder
    from pipkie.eval.evaluate import decode_batch
    from pipkie.schema import KeySchema
    from pipkie.serve.parsing import parse_decode

    text = "ACME TRADING\nTotal 9.90"
    plain = tiny_extractor.extract(None, "company,total:text", text=text)
    loud = tiny_extractor.extract(None, "company,total:text", decode="pip-shout", text=text)
    assert loud.decode == "pip-shout"
    assert loud.values() == {k: f"!{v or ''}" for k, v in plain.values().items()}
    preds = decode_batch(
        tiny_extractor.model,
        tiny_extractor.builder,
        [text],
        KeySchema.parse("company,total:text"),
        "pip-shout",
        pattern=tiny_extractor.settings.pattern,
    )
    assert {k: f.value for k, f in preds[0].items()} == loud.values()
    assert "pip-shout" in all_methods() and "pip-shout-refine1" in all_methods()
    assert method_decoder("pip-shout-refine2") == (registered, 2)
    assert parse_decode("pip-shout", 1) == ("pip-shout", 1)
