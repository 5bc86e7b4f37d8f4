"""Decoders: how an answer is produced from a model and a batch of documents.

One registry, `DECODERS` (name -> `Decoder`, `pipkie.decoding.base`), read by the Extractor,
`pipkie evaluate`, `pipkie bench`, the service and the CLI, so that a decoder has one name
everywhere:

    pip        one parallel pass over the answer template; `refine_steps` Mask-Predict passes on top
    ar-free    the AR baseline writes the whole answer, keys and values (KV cache, greedy)
    ar-forced  the decoder writes the keys, the AR baseline the values

The registry names where each decoder lives and imports it on first use (decoders need torch, the
CLI's help and the service's request parsing need only the names).

Adding a decoder: a module here with a `Decoder` subclass instance, and one line in `_WHERE`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from pipkie.decoding.base import Decoder

_WHERE = {  # name -> "module:attribute" of its Decoder
    "pip": "pipkie.decoding.pip:PIP",
    "ar-free": "pipkie.decoding.ar:AR_FREE",
    "ar-forced": "pipkie.decoding.ar:AR_FORCED",
}


class _Registry(Mapping):
    """name -> Decoder, imported when first looked up."""

    def __init__(self, where: dict[str, str]):
        self._where, self._loaded = where, {}

    def __getitem__(self, name: str) -> Decoder:
        if name not in self._loaded:
            module, _, attr = self._where[name].partition(":")
            decoder = getattr(importlib.import_module(module), attr)
            if decoder.name != name:
                raise RuntimeError(f"decoder registered as {name!r} calls itself {decoder.name!r}")
            self._loaded[name] = decoder
        return self._loaded[name]

    def __contains__(self, name: object) -> bool:  # a name check imports nothing (Mapping's would)
        return name in self._where

    def __iter__(self):
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


DECODERS: Mapping[str, Decoder] = _Registry(_WHERE)


def get_decoder(name: str | Decoder) -> Decoder:
    """The decoder called `name`; ValueError naming the choices for any other name."""
    if isinstance(name, Decoder):
        return name
    if not isinstance(name, str) or name not in DECODERS:
        raise ValueError(f"unknown decode {name!r}; choose one of {', '.join(DECODERS)}")
    return DECODERS[name]


__all__ = ["DECODERS", "Decoder", "get_decoder"]
