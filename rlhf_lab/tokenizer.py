"""A character-level tokenizer built with Hugging Face `tokenizers`.

One token per character keeps the arithmetic tasks transparent: the model sees `4`, `7`, `+`...
and a learner can read every token id. The tokenizer is saved as `tokenizer.json`, which
`transformers.PreTrainedTokenizerFast(tokenizer_file=...)` (and `AutoTokenizer` on a checkpoint
folder) loads unchanged.

    ids:  <pad>=0  <bos>=1  <eos>=2  then one id per character of CHARS
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIAL_TOKENS = (PAD, BOS, EOS)
CHARS = "0123456789+-*/=<>()[],.;:|#? abcdefghijklmnopqrstuvwxyz"


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
                    f"character {ch!r} (position {position} of {text!r}) is not in the tokenizer's vocabulary; "
                    f"allowed characters: {self.chars!r}"
                )

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        self.check(text)
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
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        kept = []
        for i in ids:
            if i == self.eos_token_id:
                return self.decode(kept), True
            kept.append(i)
        return self.decode(kept), False

    def save(self, path: str | os.PathLike) -> None:
        """Write tokenizer.json (the `tokenizers` format; the vocabulary order encodes CHARS)."""
        Path(path).write_text(self.backend.to_str(pretty=True) + "\n")

    def save_pretrained(self, folder: str | os.PathLike) -> None:
        """tokenizer.json + tokenizer_config.json, so `transformers.AutoTokenizer` loads the folder."""
        folder = Path(folder)
        self.save(folder / "tokenizer.json")
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": PAD, "bos_token": BOS,
                  "eos_token": EOS, "padding_side": "left", "model_max_length": 1_000_000}
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

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

        return PreTrainedTokenizerFast(
            tokenizer_object=self.backend, pad_token=PAD, bos_token=BOS, eos_token=EOS, padding_side="left"
        )


def default_tokenizer() -> CharTokenizer:
    return CharTokenizer()
