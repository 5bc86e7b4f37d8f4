"""A byte-level BPE tokenizer trained on our corpus (the compact track and the tests)."""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS, PAD = "<|endoftext|>", "<|pad|>"


def train_tokenizer(
    texts: Iterable[str], *, vocab_size: int = 8000, special: list[str] | None = None, split_digits: bool = True
) -> PreTrainedTokenizerFast:
    """Train BPE on `texts`; digits are split one by one (amounts and dates copy digit by digit)."""
    tok = Tokenizer(models.BPE())
    pre = [pre_tokenizers.ByteLevel(add_prefix_space=False)]
    if split_digits:
        pre.insert(0, pre_tokenizers.Digits(individual_digits=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(pre)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, PAD] + list(special or []),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD)
    if special:
        fast.add_special_tokens({"additional_special_tokens": list(special)})
    return fast
