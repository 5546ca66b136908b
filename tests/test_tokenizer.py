"""The character tokenizer: round trips, special tokens, transformers compatibility, clear errors."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from rlhf_lab.tokenizer import CHARS, CharTokenizer


def test_round_trip_and_special_ids():
    tok = CharTokenizer()
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert len(tok) == 3 + len(CHARS)
    ids = tok.encode("47+85=", add_bos=True, add_eos=True)
    assert ids[0] == 1 and ids[-1] == 2 and len(ids) == 8
    assert tok.decode(ids) == "47+85="
    assert tok.decode_until_eos(tok.encode("231", add_eos=True) + [5, 6]) == ("231", True)
    assert tok.decode_until_eos(tok.encode("23")) == ("23", False)


def test_unknown_character_is_named():
    with pytest.raises(ValueError, match=r"'A'.*position 2"):
        CharTokenizer().encode("12A")


def test_saved_tokenizer_loads_in_transformers(tmp_path):
    tok = CharTokenizer()
    tok.save(tmp_path / "tokenizer.json")
    hf = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"),
                                 pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")
    text = "sort:3194= ok"
    assert hf(text, add_special_tokens=False)["input_ids"] == tok.encode(text)
    assert hf.decode(tok.encode(text)) == text
    assert hf.eos_token_id == tok.eos_token_id
    assert CharTokenizer.load(tmp_path).encode(text) == tok.encode(text)
    assert tok.to_hf()(text, add_special_tokens=False)["input_ids"] == tok.encode(text)


def test_checkpoint_folder_tokenizer_loads_with_autotokenizer(tmp_path):
    from transformers import AutoTokenizer

    tok = CharTokenizer()
    tok.save_pretrained(tmp_path)
    hf = AutoTokenizer.from_pretrained(tmp_path)
    assert hf("12+3=", add_special_tokens=False)["input_ids"] == tok.encode("12+3=")
    assert (hf.pad_token_id, hf.bos_token_id, hf.eos_token_id) == (0, 1, 2)
