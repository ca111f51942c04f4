"""Models: names parsed once (names.py), the model families (families/: open_clip, transformers, M-CLIP,
CN-CLIP) registered in registry.py, the facts a backend reads (resolved.py, text_spec.py, towers.py),
files from the hub through clipserve's cache (hub.py, cache.py), preprocessing (preprocess.py, naflex.py,
resample.py) and tokenizers (tokenizer.py, hf_tokenizer.py, tokenizer_factory.py). It may import inputs/
and errors.py; never backends, the engine or Jina. Preprocessing and tokenizing are torch-free; the
registry and the families need torch.
"""
