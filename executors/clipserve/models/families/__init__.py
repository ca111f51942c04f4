"""The model families clipserve serves, a module each: `open_clip` (with `open_clip_files`: where its weights
and tokenizer files come from), `transformers` (with `transformers_configs`: the model types and what their
config files say), `mclip` (clip-as-service's M-CLIP) and `cnclip` (clip-as-service's CN-CLIP).

Each has FAMILY, resolve(name, ...), build(resolved, device, precision) and tokenizer_folder(resolved).
They import the shared pieces of models/ (names, resolved, dtypes, hub, preprocess, text_spec) and may
reuse one another (M-CLIP's image tower is an open_clip model), but never models/registry.py, which
registers them; nothing here imports Jina.
"""
