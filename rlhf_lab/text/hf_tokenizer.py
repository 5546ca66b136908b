"""A real checkpoint's own tokenizer behind the lab's small tokenizer interface.

Tasks, rollouts, SFT and evaluation only ever call

    tokenizer.encode(text, add_bos=False, add_eos=False) -> list[int]
    tokenizer.decode(ids) / batch_decode(rows) / decode_until_eos(ids) -> (text, finished)
    tokenizer.pad_token_id, bos_token_id, eos_token_id, vocab_size, save_pretrained(folder)

`CharTokenizer` (rlhf_lab.text.tokenizer) implements them for the lab's tiny model; `HFTokenizer` wraps any
`transformers.AutoTokenizer` (Qwen's byte-level BPE, Llama's, SmolLM's...) with the same methods, so a
trainer never knows which one it holds. One rule gives prompts the shape the checkpoint was trained on:

    encode(prompt, add_bos=True)   "this is a prompt": with a chat template, the prompt becomes one user
                                   turn plus the assistant header (`apply_chat_template(...,
                                   add_generation_prompt=True)`); without one, the tokenizer's own
                                   special tokens (its BOS, if it has one) are added.
    encode(text)                   plain text (a completion), no special tokens.

The completion ends with `eos_token_id`: for chat models the end-of-turn token (`<|im_end|>` for Qwen).

`train_bpe_tokenizer` builds a small byte-level BPE tokenizer with a ChatML template in-process (no
download): what the tests and notebook 14's tiny random Qwen3 use, saved and loaded like a real one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import torch

from ..util.validation import check_bool, check_number
from .tokenizer import decode_until_eos

# The ChatML layout Qwen2 / Qwen2.5 / Qwen3 use (without their tool-calling branches):
#   <|im_start|>system\n...<|im_end|>\n<|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHATML_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # pad, turn start, turn end (EOS)


class HFTokenizer:
    """A `transformers` tokenizer with the lab's interface (see the module docstring).

    Args:
        tokenizer: a `PreTrainedTokenizerBase` (e.g. `AutoTokenizer.from_pretrained(folder)`).
        use_chat_template: wrap prompts in the chat template; None: whenever the tokenizer has one.
        system_prompt: an optional system turn before every prompt (chat template only).
        template_kwargs: extra arguments for `apply_chat_template`, e.g. {"enable_thinking": False}
            for Qwen3's template.
    """

    def __init__(self, tokenizer, use_chat_template: bool | None = None, system_prompt: str | None = None,
                 template_kwargs: dict | None = None) -> None:
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if use_chat_template is None:
            use_chat_template = has_template
        check_bool("use_chat_template", use_chat_template)
        if use_chat_template and not has_template:
            raise ValueError("use_chat_template=True but the tokenizer has no chat_template")
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos_token: a completion could never end")
        self.hf = tokenizer
        self.use_chat_template = use_chat_template
        self.system_prompt = system_prompt
        self.template_kwargs = dict(template_kwargs or {})
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.bos_token_id = tokenizer.bos_token_id  # None for Qwen: it has no BOS
        # No pad token (Llama): pad with EOS, as transformers' generate does; the masks hide it.
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else self.eos_token_id)

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike, **kwargs) -> HFTokenizer:
        """Load a checkpoint folder's tokenizer (tokenizer.json / tokenizer_config.json) with
        AutoTokenizer."""
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(folder)), **kwargs)

    @property
    def vocab_size(self) -> int:
        return len(self.hf)  # base vocabulary plus added special tokens

    def __len__(self) -> int:
        return self.vocab_size

    def check(self, text: str) -> None:
        """Byte-level BPE encodes any text: nothing to check (the character tokenizer's hook)."""

    def messages(self, prompt: str) -> list[dict]:
        """The chat turns a prompt becomes: [system,] user."""
        turns = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return turns + [{"role": "user", "content": prompt}]

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Token ids of `text`. add_bos=True marks a prompt (chat template or BOS, see the module
        docstring); add_eos=True appends the end-of-completion id."""
        if add_bos and self.use_chat_template:
            ids = self.hf.apply_chat_template(self.messages(text), add_generation_prompt=True, tokenize=True,
                                              return_dict=False, **self.template_kwargs)
            ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
        else:
            ids = self.hf(text, add_special_tokens=add_bos)["input_ids"] if text else []
            if add_bos and self.bos_token_id is not None and (not ids or ids[0] != self.bos_token_id):
                ids = [self.bos_token_id] + ids  # a tokenizer whose post-processor adds no BOS
        return [int(i) for i in ids] + ([self.eos_token_id] if add_eos else [])

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def batch_decode(self, batch, skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(row, skip_special_tokens) for row in batch]

    def decode_until_eos(self, ids) -> tuple[str, bool]:
        """Text up to (not including) the first EOS, and whether an EOS was found."""
        return decode_until_eos(self, ids)

    def save_pretrained(self, folder: str | os.PathLike) -> None:
        self.hf.save_pretrained(str(folder))

    def __repr__(self) -> str:
        return (f"HFTokenizer({type(self.hf).__name__}, vocab {self.vocab_size}, eos {self.eos_token_id}, "
                f"chat template {'on' if self.use_chat_template else 'off'})")


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 512, chat_template: str = CHATML_TEMPLATE,
                        **kwargs) -> HFTokenizer:
    """A byte-level BPE tokenizer trained on `texts`, with ChatML special tokens and template.

    The same kind of tokenizer as Qwen's (byte-level BPE: every string is encodable), only small:
    for in-process models in tests and notebooks. `kwargs` go to `HFTokenizer`.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    check_number("vocab_size", vocab_size, low=len(CHATML_SPECIAL_TOKENS) + 256, integer=True)
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(CHATML_SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator(list(texts), trainer=trainer)
    pad, _, end_of_turn = CHATML_SPECIAL_TOKENS
    hf = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=end_of_turn,
        pad_token=pad,
        chat_template=chat_template,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    return HFTokenizer(hf, **kwargs)


def is_char_tokenizer(folder: str | os.PathLike) -> bool:
    """Whether a checkpoint folder's tokenizer.json is the lab's character tokenizer (a WordLevel model)."""
    import json

    path = Path(folder) / "tokenizer.json"
    try:
        return json.loads(path.read_text())["model"]["type"] == "WordLevel"
    except (OSError, ValueError, KeyError, TypeError):
        return False
