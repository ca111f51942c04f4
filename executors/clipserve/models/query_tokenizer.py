"""Late-interaction queries (ColPali, ColQwen2) tokenized as their processors' `process_queries` does it,
without torch or transformers: each text becomes `prefix + text + suffix` (ColPali: '<bos>Question: ' ...
ten '<pad>' ... '\\n'; ColQwen2: 'Query: ' ... ten '<|endoftext|>' ... '\\n'), tokenized as one string by the
checkpoint's tokenizer.json with no special tokens added by the tokenizer (the processors switch its BOS
and EOS off, or it has none); the special tokens written in the string encode as themselves.

The ten trailing pad tokens are the query augmentation ("reasoning buffers"): real tokens, attended to and
embedded, so the attention mask, not the token id, says what is padding. Padding is on the right whatever
the tokenizer's side (both models use rotary positions, so a left-padded batch, as transformers pads
ColPali's, gives the same vectors), which keeps every query's vectors independent of its batch. The
processors never truncate; a server must, at `context_length` tokens: a longer query keeps its prefix,
as much of its text as fits and its whole suffix (a query cut short still ends as the model was trained).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from clipserve.models.hf_tokenizer import TOKENIZER_FILE, TokenizerFilesError, special_tokens
from clipserve.models.tokenizer import TokenBatch


class QueryTokenizer:
    """texts -> TokenBatch of `prefix + text + suffix`, right padded to `context_length` with the pad id."""

    def __init__(self, folder: str | Path, context_length: int, prefix: str, suffix: str):
        from tokenizers import Tokenizer as RustTokenizer

        folder = Path(folder)
        path = folder / TOKENIZER_FILE
        if not path.is_file():
            raise TokenizerFilesError(f'{str(folder)!r} has no {TOKENIZER_FILE}, which late-interaction queries need')
        self._tokenizer = RustTokenizer.from_file(str(path))
        pad = special_tokens(folder).get('pad_token')
        self.pad_id = self._tokenizer.token_to_id(pad) if pad is not None else None
        if self.pad_id is None:
            raise TokenizerFilesError(
                f'the tokenizer in {str(folder)!r} has no pad token (tokenizer_config.json "pad_token"): '
                'late-interaction queries end with pad tokens, and batches are padded with it'
            )
        self.context_length = int(context_length)
        self.prefix, self.suffix = prefix, suffix
        self._suffix_ids = self._tokenizer.encode(suffix, add_special_tokens=False).ids if suffix else []
        if len(self._suffix_ids) >= self.context_length:
            raise TokenizerFilesError(f'the query suffix alone is {len(self._suffix_ids)} tokens, over the context')
        self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)

    def token_ids(self, text: str) -> list[int]:
        """One query's ids as the processor gives them, cut to the context (prefix and suffix kept)."""
        ids = self._tokenizer.encode(f'{self.prefix}{text}{self.suffix}', add_special_tokens=False).ids
        if len(ids) <= self.context_length:
            return ids
        tail = len(self._suffix_ids)
        return ids[: self.context_length - tail] + ids[len(ids) - tail :]

    def __call__(self, texts: str | Sequence[str]) -> TokenBatch:
        if isinstance(texts, str):
            texts = [texts]
        input_ids = np.full((len(texts), self.context_length), self.pad_id, dtype=np.int64)
        attention_mask = np.zeros((len(texts), self.context_length), dtype=np.int64)
        encodings = self._tokenizer.encode_batch(
            [f'{self.prefix}{t}{self.suffix}' for t in texts], add_special_tokens=False
        )
        for row, (text, encoding) in enumerate(zip(texts, encodings)):
            ids = encoding.ids if len(encoding.ids) <= self.context_length else self.token_ids(text)
            input_ids[row, : len(ids)] = ids
            attention_mask[row, : len(ids)] = 1
        return TokenBatch(input_ids=input_ids, attention_mask=attention_mask, lengths=attention_mask.sum(axis=1))
