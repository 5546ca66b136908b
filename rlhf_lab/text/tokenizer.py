"""A character-level tokenizer built with Hugging Face `tokenizers`.

One token per character keeps the arithmetic tasks transparent: the model sees `4`, `7`, `+`...
and a learner can read every token id. The tokenizer is saved as `tokenizer.json`, which
`transformers.PreTrainedTokenizerFast(tokenizer_file=...)` (and `AutoTokenizer` on a checkpoint
folder) loads unchanged.

    ids:  <pad>=0  <bos>=1  <eos>=2  then one id per character of CHARS

The models are trained on `<bos> prompt completion <eos>`. The lab adds the BOS itself
(`encode(text, add_bos=True)`); `tokenizer.json` carries the same rule as its post-processor
(`<bos> $A`), so `AutoTokenizer.from_pretrained(folder)(text)` gives the very ids the lab does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIAL_TOKENS = (PAD, BOS, EOS)
CHARS = "0123456789+-*/=<>()[],.;:|#? abcdefghijklmnopqrstuvwxyz"


def bos_post_processor(bos_token_id: int) -> processors.TemplateProcessing:
    """`<bos> $A` (and `<bos> $A <bos> $B` for pairs): what `add_special_tokens=True` adds.

    The very template transformers builds itself from add_bos_token=True / add_eos_token=False
    (`TokenizersBackend.update_post_processor`), so the tokenizer behaves the same whether
    transformers keeps this post-processor or rebuilds it from tokenizer_config.json.
    """
    return processors.TemplateProcessing(
        single=f"{BOS}:0 $A:0", pair=f"{BOS}:0 $A:0 {BOS}:1 $B:1", special_tokens=[(BOS, bos_token_id)]
    )


# tokenizer_config.json. What adds the BOS is tokenizer.json's post-processor: transformers 5 drops
# add_bos_token / add_eos_token from the config whenever a tokenizer.json is there (so the loaded
# tokenizer's `.add_bos_token` attribute reads False even though it adds the BOS). They are written
# anyway, saying the same as the post-processor, for whatever builds the template from them (a
# transformers constructor given them as keywords rebuilds it, as `to_hf` below does). Left padding
# is what batched `generate` needs; no clean-up of spaces around punctuation, which would turn
# "1 , 2" into "1, 2" on decoding.
HF_TOKENIZER_CONFIG: dict = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "pad_token": PAD, "bos_token": BOS, "eos_token": EOS,
    "add_bos_token": True, "add_eos_token": False,
    "padding_side": "left",
    "clean_up_tokenization_spaces": False,
    "model_max_length": 1_000_000,
}


class CharTokenizer:
    """Characters <-> ids. Encoding text with a character outside the vocabulary raises ValueError."""

    def __init__(self, chars: str = CHARS) -> None:
        if len(set(chars)) != len(chars):
            raise ValueError("chars must not contain duplicates")
        vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
        for ch in chars:
            vocab[ch] = len(vocab)
        backend = Tokenizer(models.WordLevel(vocab, unk_token=None))
        backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one piece per char
        backend.decoder = decoders.Fuse()  # join pieces back without spaces
        backend.add_special_tokens(list(SPECIAL_TOKENS))
        backend.post_processor = bos_post_processor(vocab[BOS])
        self.backend = backend
        self.chars = chars
        self.vocab = vocab
        self.id_to_token = {i: t for t, i in vocab.items()}
        self.pad_token_id, self.bos_token_id, self.eos_token_id = (vocab[t] for t in SPECIAL_TOKENS)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def __len__(self) -> int:
        return len(self.vocab)

    def check(self, text: str) -> None:
        """Raise a ValueError naming the first character the vocabulary does not have."""
        for position, ch in enumerate(text):
            if ch not in self.vocab:
                raise ValueError(
                    f"character {ch!r} (position {position} of {text!r}) is not in the tokenizer's "
                    "vocabulary; "
                    f"allowed characters: {self.chars!r}"
                )

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        self.check(text)
        # add_special_tokens=False: the BOS (and EOS) are added here, explicitly, never by the post-processor.
        ids = self.backend.encode(text, add_special_tokens=False).ids if text else []
        return ([self.bos_token_id] if add_bos else []) + ids + ([self.eos_token_id] if add_eos else [])

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        out = []
        for i in ids:
            token = self.id_to_token.get(int(i))
            if token is None or (skip_special_tokens and token in SPECIAL_TOKENS):
                continue
            out.append(token)
        return "".join(out)

    def batch_decode(self, batch, skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(row, skip_special_tokens) for row in batch]

    def decode_until_eos(self, ids) -> tuple[str, bool]:
        """Text up to (not including) the first EOS, and whether an EOS was found. Padding is skipped."""
        return decode_until_eos(self, ids)

    def save(self, path: str | os.PathLike) -> None:
        """Write tokenizer.json (the `tokenizers` format; the vocabulary order encodes CHARS)."""
        Path(path).write_text(self.backend.to_str(pretty=True) + "\n")

    def save_pretrained(self, folder: str | os.PathLike) -> None:
        """tokenizer.json + tokenizer_config.json, so `transformers.AutoTokenizer` loads the folder and,
        with its default `add_special_tokens=True`, encodes like `encode(text, add_bos=True)`."""
        folder = Path(folder)
        self.save(folder / "tokenizer.json")
        (folder / "tokenizer_config.json").write_text(
            json.dumps(HF_TOKENIZER_CONFIG, indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> CharTokenizer:
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        try:
            vocab = json.loads(path.read_text())["model"]["vocab"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{path} is not a readable tokenizer.json ({exc})") from exc
        ordered = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
        if tuple(ordered[: len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            raise ValueError(f"{path}: expected special tokens {SPECIAL_TOKENS} first, got {ordered[:3]}")
        return cls("".join(ordered[len(SPECIAL_TOKENS):]))

    def to_hf(self):
        """The same tokenizer as a `transformers.PreTrainedTokenizerFast`."""
        from transformers import PreTrainedTokenizerFast

        kwargs = {k: v for k, v in HF_TOKENIZER_CONFIG.items() if k != "tokenizer_class"}
        return PreTrainedTokenizerFast(tokenizer_object=self.backend, **kwargs)


def decode_until_eos(tokenizer, ids) -> tuple[str, bool]:
    """Text of `ids` up to (not including) the first `tokenizer.eos_token_id`, and whether one was found.

    Shared by every tokenizer with the lab's interface (CharTokenizer, HFTokenizer)."""
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist()
    kept = []
    for i in ids:
        if i == tokenizer.eos_token_id:
            return tokenizer.decode(kept), True
        kept.append(i)
    return tokenizer.decode(kept), False


def default_tokenizer() -> CharTokenizer:
    return CharTokenizer()
