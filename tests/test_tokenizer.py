"""The character tokenizer: round trips, special tokens, transformers compatibility, clear errors."""

from __future__ import annotations

import json

import pytest
from transformers import PreTrainedTokenizerFast

from rlhf_lab.text.tokenizer import CHARS, HF_TOKENIZER_CONFIG, CharTokenizer

TEXTS = ["47+85=", "", "sort:3194= ok", "a , b .", "(1+2)*3=9"]


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
    assert hf.padding_side == "left"


def test_autotokenizer_adds_the_bos_like_the_lab(tmp_path):
    """tokenizer.json's post-processor adds the BOS, so transformers' default call gives the lab's ids."""
    from transformers import AutoTokenizer

    tok = CharTokenizer()
    tok.save_pretrained(tmp_path)
    hf = AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        ids = tok.encode(text, add_bos=True)
        # exactly one BOS: the post-processor is not applied
        assert ids == [tok.bos_token_id] + tok.encode(text)
        assert hf(text)["input_ids"] == ids, text
        assert tok.to_hf()(text)["input_ids"] == ids, text
        assert hf.decode(ids, skip_special_tokens=True) == text  # no clean-up of spaces before punctuation
    batch = hf(["1+2=", "100+200="], padding=True)["input_ids"]
    assert batch[0] == [0, 0, 0, 0] + tok.encode("1+2=", add_bos=True)  # left padding, then the BOS
    assert tok.encode("12", add_bos=True, add_eos=True) == [1, 4, 5, 2]


def test_saved_files_agree_and_load_back(tmp_path):
    tok = CharTokenizer()
    tok.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "tokenizer.json").read_text())
    assert saved["post_processor"]["type"] == "TemplateProcessing"
    assert [next(iter(piece)) for piece in saved["post_processor"]["single"]] == ["SpecialToken", "Sequence"]
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config == HF_TOKENIZER_CONFIG
    assert (config["add_bos_token"], config["add_eos_token"]) == (True, False)  # what the post-processor does
    again = CharTokenizer.load(tmp_path)
    assert again.vocab == tok.vocab
    assert [again.encode(t, add_bos=True) for t in TEXTS] == [tok.encode(t, add_bos=True) for t in TEXTS]


def test_tokenizer_json_without_post_processor_still_loads(tmp_path):
    """Folders saved before the post-processor existed (post_processor: null) load unchanged in the lab."""
    tok = CharTokenizer()
    tok.save(tmp_path / "tokenizer.json")
    saved = json.loads((tmp_path / "tokenizer.json").read_text())
    saved["post_processor"] = None
    (tmp_path / "tokenizer.json").write_text(json.dumps(saved))
    old = CharTokenizer.load(tmp_path)
    assert [old.encode(t, add_bos=True) for t in TEXTS] == [tok.encode(t, add_bos=True) for t in TEXTS]
