"""What every decoder is: one interface, so that extract, evaluate, bench and the service run any
decoder the same way (`pipkie.decoding.DECODERS` lists them)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from pipkie.decoding.abstain import withhold  # (plain Python: no torch)
from pipkie.decoding.disjoint import disjoint  # (plain Python too)
from pipkie.decoding.labels import drop_labels  # (plain Python too)
from pipkie.decoding.snap import snap_predictions  # (plain Python too)
from pipkie.decoding.types import reject_untyped  # (plain Python too)

if TYPE_CHECKING:  # (decoders are listed without importing torch: `pipkie.decoding`)
    from pipkie.model.template import Encoded, TemplateBuilder
    from pipkie.schema import KeySchema


class Decoder(ABC):
    """A way to produce the answer of a batch of (document text, KeySchema).

    `objective` says which model it runs on: "pip" (a PIP model's template) or "ar" (an AR model;
    for a PIP model, its AR baseline: `pipkie.model.modeling.model_for_decode`). `refines`: it
    takes `refine_steps`."""

    name: str
    objective: str
    help: str
    refines: bool = False

    @abstractmethod
    def decode(
        self,
        model,
        builder: TemplateBuilder,
        texts: list[str],
        schemas: list[KeySchema],
        *,
        pattern: str = "prefix_causal",
        refine_steps: int = 0,
        trace: list | None = None,
        stats=None,
    ) -> list[dict]:
        """Per document, key -> FieldResult (or ItemsResult for a list). `pattern`: the PIP
        model's attention pattern (its `Settings.pattern`); `trace`: per document, what the copy
        head computed (PIP with a copy head; others append nothing); `stats`: an AR decoder counts
        its steps and tokens into it (`pipkie.decoding.ar.ARStats`; others leave it as it is)."""

    @abstractmethod
    def encode(self, builder: TemplateBuilder, text: str, schema: KeySchema) -> Encoded:
        """The model input of one document (what `truncated` is counted on)."""

    @abstractmethod
    def reserved(self, builder: TemplateBuilder, schema: KeySchema) -> int:
        """Tokens kept free next to the document for the answer (template or AR answer budget)."""

    def __call__(
        self,
        model,
        builder,
        texts,
        schemas,
        *,
        pattern="prefix_causal",
        refine_steps=0,
        trace=None,
        snap=True,
        abstain: dict[str, float] | None = None,
        stats=None,
    ):
        """`decode` (each list's K cut to its document's lines + 1: `pipkie.model.groups.within_lines`),
        and with `snap` every value that ends inside a document word completed to the
        word's end (`pipkie.decoding.snap`), then a typed key's value not of its type made unknown
        (`pipkie.decoding.types`), then with `snap` a value that runs on into another key's value
        ended where that one starts (`pipkie.decoding.disjoint`), then a list's items without a
        required field left out (`pipkie.model.groups.keep_complete`), then the lines a list skipped
        between two of its items filled in by their neighbours' layout (`pipkie.decoding.gaps`), then
        a value's trailing label (`Tel:`) dropped and a list's summary lines (`SUBTOTAL:`, decoded or
        filled in) left out (`pipkie.decoding.labels`), then a value below its key's `abstain`
        threshold made unknown (`pipkie.decoding.abstain`: the
        model's `Settings.abstention`), for every decoder alike."""
        from pipkie.decoding.gaps import fill_prediction
        from pipkie.model.groups import keep_complete, within_lines

        if refine_steps and not self.refines:
            raise ValueError(f"decode {self.name!r} does not refine (refine_steps={refine_steps})")
        schemas = [within_lines(builder, s, t) for s, t in zip(schemas, texts)]  # K <= the document's lines + 1
        preds = self.decode(
            model, builder, texts, schemas, pattern=pattern, refine_steps=refine_steps, trace=trace, stats=stats
        )
        preds = snap_predictions(preds, texts) if snap else preds
        preds = [reject_untyped(p, s) for p, s in zip(preds, schemas)]
        preds = [disjoint(p, t) for p, t in zip(preds, texts)] if snap else preds
        preds = [fill_prediction(keep_complete(p, s), t) for p, s, t in zip(preds, schemas, texts)]
        return [withhold(drop_labels(p), abstain) for p in preds]

    def __repr__(self) -> str:
        return f"<Decoder {self.name}>"
