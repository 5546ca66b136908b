"""Tokenizers: the lab's character tokenizer and any Hugging Face checkpoint's own, one interface.

tokenizer.py     CharTokenizer: one token per character (the arithmetic tasks stay transparent)
hf_tokenizer.py  HFTokenizer: a checkpoint's own tokenizer (AutoTokenizer and its chat template)
"""
