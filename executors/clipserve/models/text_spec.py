"""What a model's text side needs, as data: which tokenizer, its context length, cleaning and padding rule.

Read from open_clip's model config (`text_cfg`) when a model is resolved, written into an export's
`clipserve.json`, and read back by the torch-free backends, so every backend tokenizes a model the
same way open_clip does. Pure data: no torch, no tokenizer library.
"""

from __future__ import annotations

from dataclasses import dataclass

BPE_TOKENIZER = 'openai-clip-bpe'  # open_clip's SimpleTokenizer (clipserve's models/tokenizer.py)
HF_TOKENIZER = 'hf-tokenizers'  # a Hugging Face tokenizer.json (clipserve's models/hf_tokenizer.py)
TOKENIZER_KINDS = (BPE_TOKENIZER, HF_TOKENIZER)
# open_clip's get_clean_fn; none: M-CLIP, CN-CLIP, transformers checkpoints; siglip2: as transformers'
# Siglip2Tokenizer loads tokenizer.json (hf_tokenizer.py)
CLEAN_MODES = ('lower', 'whitespace', 'canonicalize', 'none', 'siglip2')
DEFAULT_CONTEXT_LENGTH = 77
BPE_VOCAB_SIZE = 49408


@dataclass(frozen=True)
class TextSpec:
    """How texts become token ids for one model.

    `causal`: padding never changes a text's embedding (a causal tower pooling at the end-of-text
    token, or one that attends to and pools over unmasked positions only), so a batch may run only up
    to its longest text (padding trimmed); otherwise it takes exactly `context_length` ids, padded
    with `pad_id` as open_clip pads them.
    """

    tokenizer: str = BPE_TOKENIZER
    context_length: int = DEFAULT_CONTEXT_LENGTH
    clean: str = 'lower'
    strip_sep_token: bool = False
    causal: bool = True
    hf_tokenizer_name: str | None = None  # where open_clip downloads the tokenizer files from
    vocab_size: int = BPE_VOCAB_SIZE
    # late-interaction queries (query_tokenizer.py): each text as prompt_prefix + text + prompt_suffix, tokenized
    # as one string without the tokenizer's own special tokens; None: texts as they are
    prompt_prefix: str | None = None
    prompt_suffix: str = ''

    def __post_init__(self):
        if self.tokenizer not in TOKENIZER_KINDS:
            raise ValueError(f'unknown tokenizer kind {self.tokenizer!r}; known: {", ".join(TOKENIZER_KINDS)}')
        if self.clean not in CLEAN_MODES:
            raise ValueError(f'unknown text cleaning {self.clean!r}; known: {", ".join(CLEAN_MODES)}')
        if int(self.context_length) < 2:
            raise ValueError(f'context_length must be at least 2, got {self.context_length}')

    @property
    def needs_tokenizer_files(self) -> bool:
        return self.tokenizer == HF_TOKENIZER

    @classmethod
    def from_open_clip(cls, model_cfg: dict) -> TextSpec:
        """The text facts of an open_clip model config, as open_clip's get_tokenizer reads them."""
        text_cfg = model_cfg.get('text_cfg', {})
        if text_cfg.get('tokenizer_mode'):
            raise ValueError(f'tokenizer_mode {text_cfg["tokenizer_mode"]!r} is not supported')
        hf_name = text_cfg.get('hf_tokenizer_name') or None
        kwargs = dict(text_cfg.get('tokenizer_kwargs') or {})
        unknown = set(kwargs) - {'clean', 'strip_sep_token'}
        if unknown:
            raise ValueError(f'tokenizer_kwargs {sorted(unknown)} are not supported')
        if hf_name:
            kind, clean = HF_TOKENIZER, kwargs.get('clean', 'whitespace')  # HFTokenizer's default
        else:
            kind, clean = BPE_TOKENIZER, kwargs.get('clean', 'lower')  # SimpleTokenizer's default
        # open_clip's own text tower is causal unless told otherwise; Hugging Face text towers are not.
        custom_hf_tower = bool(text_cfg.get('hf_model_name'))
        causal = not custom_hf_tower and not text_cfg.get('no_causal_mask', False)
        causal = causal and text_cfg.get('pool_type', 'argmax') in ('argmax', 'eos')
        return cls(
            tokenizer=kind,
            context_length=int(text_cfg.get('context_length', DEFAULT_CONTEXT_LENGTH)),
            clean=clean,
            strip_sep_token=bool(kwargs.get('strip_sep_token', False)),
            causal=causal,
            hf_tokenizer_name=hf_name,
            vocab_size=int(text_cfg.get('vocab_size', BPE_VOCAB_SIZE)),
        )
