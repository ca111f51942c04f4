"""The tokenizer a model's TextSpec names: open_clip's BPE (bundled) or the model's own Hugging Face
tokenizer files. Torch-free, so the ONNX and TensorRT backends tokenize exactly as the torch one does."""

from __future__ import annotations

from pathlib import Path

from clipserve.models.hf_tokenizer import HFTokenizer, TokenizerFilesError
from clipserve.models.text_spec import BPE_TOKENIZER, TextSpec
from clipserve.models.tokenizer import Tokenizer


def make_tokenizer(spec: TextSpec, folder: str | Path | None = None):
    """A callable texts -> TokenBatch for `spec`; `folder` holds the tokenizer files of HF-tokenized models."""
    if spec.tokenizer == BPE_TOKENIZER:
        if spec.clean != 'lower':
            raise TokenizerFilesError(f"open_clip's BPE tokenizer with clean={spec.clean!r} is not supported")
        return Tokenizer(context_length=spec.context_length)
    if folder is None:
        raise TokenizerFilesError(
            f'this model tokenizes with a Hugging Face tokenizer ({spec.hf_tokenizer_name or "unnamed"}) '
            'and no tokenizer files were found'
        )
    if spec.prompt_prefix is not None:
        from clipserve.models.query_tokenizer import QueryTokenizer

        return QueryTokenizer(folder, spec.context_length, spec.prompt_prefix, spec.prompt_suffix)
    return HFTokenizer(folder, spec.context_length, spec.clean, spec.strip_sep_token)
