"""FastEmbed in-process on clipserve's ONNX export of a CLIP text tower: its texts/s, like for like.

    .venv/bin/python -m benchmarks.fastembed_text EXPORT_DIR [--text TEXT] [--batch 256] [--seconds 4] [--serve]

EXPORT_DIR is a folder written by `python -m clipserve export onnx` (textual.onnx, its .data, clipserve.json).
FastEmbed (`fastembed`, the `bench` extra) loads a local model as a custom model from a folder with the
graph and Hugging Face tokenizer files; clipserve's CLIP BPE has no such files, so `write_tokenizer_files`
derives a `tokenizer.json` that tokenizes as clipserve's Tokenizer does (open_clip's SimpleTokenizer:
byte-level BPE over OpenAI's vocabulary with `</w>` word ends, <start_of_text> ... <end_of_text>, 75
tokens at most between them, padded with id 0). Its cleaning is NFC, curly quotes made straight,
whitespace collapsed, lower case: what ftfy and HTML unescaping do to plain text; text with HTML entities,
ligatures or full-width characters is cleaned by clipserve only.

The graph takes int64 `input_ids` and `attention_mask` and returns the pooled, projected embedding, so
FastEmbed's pooling and normalisation are off. Before timing, the script checks that FastEmbed's token
ids and embeddings equal clipserve's onnx backend's on a few texts (min cosine printed; below 0.9999 it
stops), then times `TextEmbedding.embed` on `--batch` copies of `--text` per call, as a sustained rate.
FastEmbed runs in this process with its own onnxruntime session and default threads, which is why the
serving benchmark starts this script as a subprocess: its threads share nothing with the benchmark's.

With `--serve`, after one JSON line ({"min_cosine": ..., "tokens_equal": ...}) it reads a number of
seconds per line from stdin and answers each with one JSON line ({"texts_per_s": ...}), so that the
caller can measure it between its own windows without loading it again; it ends at EOF.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.common import sustained_rate

SOT, EOT = '<start_of_text>', '<end_of_text>'  # open_clip's names, which clipserve's Tokenizer also reads in texts
MODEL_NAME = 'clipserve/textual-onnx'  # the name FastEmbed registers the export under
CONTEXT_LENGTH = 77
NUM_MERGES = 49152 - 256 - 2  # the merges CLIP was trained with (the rest of the file is unused)
# texts whose tokens and embeddings must agree before anything is timed: accents, punctuation, contractions,
# digits, curly quotes, a special token in the text, and one far longer than the 75 tokens the model reads
CHECK_TEXTS = (
    'a photo of a small brown dog running on the beach',
    'Café crème, naïve façade — Zürich & São Paulo!!',
    "It's 3:45pm... don't you think?? (yes) [no] {maybe} <tag> a/b\\c ~ @#$%^*",
    '“Curly quotes” and ‘single’ ones',
    'Ünïcödé ÀÉÎÕÜ ßœæ 東京 😀 emoji',
    'a sentence with <end_of_text> inside',
    '   lots   of\twhitespace \n and  newlines  ',
    ' '.join(f'word{i} with punctuation, accents é and more' for i in range(40)),
)


def byte_symbols() -> list[str]:
    """GPT-2's byte-to-character table, in the vocabulary's order: printable bytes as themselves
    first, then the other 256 - 188 bytes as characters from U+0100 on (BPE never sees whitespace)."""
    printable = [*range(ord('!'), ord('~') + 1), *range(ord('¡'), ord('¬') + 1), *range(ord('®'), ord('ÿ') + 1)]
    rest = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + i) for i in range(len(rest))]


def clip_vocab_and_merges(vocab_gz: str | None = None) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """CLIP's BPE vocabulary (token -> id) and merges (best first) from OpenAI's bpe_simple_vocab_16e6.txt.gz.

    Ids: the 256 byte symbols, the same with `</w>` (a word's last symbol), one token per merge in
    merge order, then <start_of_text> and <end_of_text> (49406, 49407).
    """
    if vocab_gz is None:
        from clipserve.models.tokenizer import VOCAB_PATH

        vocab_gz = VOCAB_PATH
    with gzip.open(vocab_gz, 'rt', encoding='utf-8') as f:
        lines = f.read().split('\n')[1 : NUM_MERGES + 1]  # the first line is a version header
    merges = [tuple(line.split()) for line in lines]
    symbols = byte_symbols()
    tokens = [*symbols, *(s + '</w>' for s in symbols), *(a + b for a, b in merges), SOT, EOT]
    return {token: i for i, token in enumerate(tokens)}, merges


def write_tokenizer_files(folder: str | os.PathLike, vocab_gz: str | None = None) -> Path:
    """Hugging Face tokenizer files in `folder` that tokenize as clipserve's Tokenizer; returns tokenizer.json's path.

    Writes vocab.json and merges.txt (the BPE), tokenizer.json (the `tokenizers` pipeline around them),
    tokenizer_config.json (context 77, pad token), special_tokens_map.json and config.json: what FastEmbed's
    `load_tokenizer` reads.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab, merges = clip_vocab_and_merges(vocab_gz)
    (folder / 'vocab.json').write_text(json.dumps(vocab, ensure_ascii=False))
    (folder / 'merges.txt').write_text('#version: 0.2\n' + ''.join(f'{a} {b}\n' for a, b in merges), encoding='utf-8')
    bpe = models.BPE.from_file(
        str(folder / 'vocab.json'),
        str(folder / 'merges.txt'),
        end_of_word_suffix='</w>',
        continuing_subword_prefix='',
        unk_token=EOT,
        fuse_unk=False,
    )
    tokenizer = Tokenizer(bpe)
    tokenizer.normalizer = normalizers.Sequence(
        [
            normalizers.NFC(),
            normalizers.Replace(Regex('[\u02bc\u2018-\u201b]'), "'"),  # ftfy's uncurl_quotes
            normalizers.Replace(Regex('[\u201c-\u201f]'), '"'),
            normalizers.Replace(Regex(r'\s+'), ' '),
            normalizers.Lowercase(),
        ]
    )
    # open_clip's word pattern (less its special tokens, which are added tokens here); the text between
    # matches (spaces) is dropped; then each word as bytes, mapped to the printable symbols
    words = r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(words), behavior='removed', invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    # matched in the cleaned (normalised) text, as clipserve's pattern matches them after lower-casing
    specials = [AddedToken(t, special=True, normalized=True) for t in (SOT, EOT)]
    tokenizer.add_special_tokens(specials)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f'{SOT} $A {EOT}', special_tokens=[(SOT, vocab[SOT]), (EOT, vocab[EOT])]
    )
    tokenizer.enable_truncation(CONTEXT_LENGTH)  # room for SOT and EOT is kept: 75 tokens between them
    tokenizer.enable_padding(pad_id=0, pad_token='!')  # CLIP pads with id 0 ('!'), as clipserve does
    tokenizer.save(str(folder / 'tokenizer.json'))

    def special(token: str) -> dict:
        return {'content': token, 'single_word': False, 'lstrip': False, 'rstrip': False, 'normalized': True}

    # no pad token here: FastEmbed adds every token of this map as a special token, and '!' is ordinary text
    (folder / 'special_tokens_map.json').write_text(
        json.dumps({'bos_token': special(SOT), 'eos_token': special(EOT), 'unk_token': special(EOT)}, indent=2)
    )
    (folder / 'tokenizer_config.json').write_text(
        json.dumps(
            {
                'model_max_length': CONTEXT_LENGTH,
                'pad_token': '!',
                'padding_side': 'right',
                'truncation_side': 'right',
                'bos_token': SOT,
                'eos_token': EOT,
                'unk_token': EOT,
            },
            indent=2,
        )
    )
    (folder / 'config.json').write_text(
        json.dumps(
            {
                'pad_token_id': 0,
                'bos_token_id': vocab[SOT],
                'eos_token_id': vocab[EOT],
                'vocab_size': len(vocab),
                'max_position_embeddings': CONTEXT_LENGTH,
            },
            indent=2,
        )
    )
    return folder / 'tokenizer.json'


def model_folder(export_dir: str | os.PathLike, folder: str | os.PathLike) -> Path:
    """`folder` with symlinks to the export's textual.onnx (and its external data) and the tokenizer files."""
    export_dir, folder = Path(export_dir).resolve(), Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for path in export_dir.glob('textual.onnx*'):
        link = folder / path.name
        if not link.exists():
            link.symlink_to(path)  # onnxruntime finds the data where the graph resolves to
    write_tokenizer_files(folder)
    return folder


def load_fastembed(folder: Path, dim: int, threads: int | None = None):
    """FastEmbed's TextEmbedding on the graph in `folder`: pooling and normalisation off (the graph pools)."""
    from fastembed import TextEmbedding
    from fastembed.common.model_description import ModelSource, PoolingType

    data = [p.name for p in folder.glob('textual.onnx.*')]
    if not any(m['model'] == MODEL_NAME for m in TextEmbedding.list_supported_models()):
        TextEmbedding.add_custom_model(
            model=MODEL_NAME,
            pooling=PoolingType.DISABLED,
            normalization=False,
            sources=ModelSource(hf=MODEL_NAME),  # never fetched: the model is read from specific_model_path
            dim=dim,
            model_file='textual.onnx',
            additional_files=data,
        )
    return TextEmbedding(
        model_name=MODEL_NAME,
        specific_model_path=str(folder),
        cache_dir=str(folder),
        threads=threads,
        cuda=False,
        local_files_only=True,
    )


def check_against_clipserve(model, export_dir: str, texts) -> dict:
    """Token ids and embeddings of FastEmbed and of clipserve's onnx backend (fp32, CPU) on `texts`."""
    import gc

    import numpy as np

    from clipserve.backends import BackendOptions, create_backend

    backend = create_backend('onnx', None, BackendOptions(device='cpu', dtype='fp32'), model_path=export_dir)
    tokens = backend.tokenizer(list(texts))
    theirs = model.model.tokenizer.encode_batch(list(texts))
    tokens_equal = all(
        list(enc.ids[: int(n)]) == tokens.input_ids[row, : int(n)].tolist() and sum(enc.attention_mask) == int(n)
        for row, (enc, n) in enumerate(zip(theirs, tokens.lengths))
    )
    ours = backend.encode_texts(tokens.input_ids, tokens.attention_mask).astype(np.float64)
    fast = np.stack(list(model.embed(list(texts), batch_size=len(texts)))).astype(np.float64)
    cosine = (ours * fast).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(fast, axis=1)
    del backend
    gc.collect()
    return {'min_cosine': float(cosine.min()), 'tokens_equal': bool(tokens_equal), 'texts': len(texts)}


def texts_per_second(model, text: str, batch: int, seconds: float) -> float:
    """Sustained texts/s of `embed` on `batch` copies of `text` per call (one warm-up call first)."""
    texts = [text] * batch

    def call():
        for _ in model.embed(texts, batch_size=batch):
            pass

    return sustained_rate(call, batch, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('export_dir', help="a clipserve ONNX export's folder")
    parser.add_argument('--text', default=CHECK_TEXTS[0], help='the text timed, in batches of copies')
    parser.add_argument('--batch', type=int, default=256)
    parser.add_argument('--seconds', type=float, default=4.0)
    parser.add_argument('--threads', type=int, default=None, help="onnxruntime's threads (default: FastEmbed's)")
    parser.add_argument('--serve', action='store_true', help='answer a rate per line of seconds read from stdin')
    args = parser.parse_args()

    meta = json.loads((Path(args.export_dir) / 'clipserve.json').read_text())
    with tempfile.TemporaryDirectory(prefix='clipserve-fastembed-') as tmp:
        model = load_fastembed(model_folder(args.export_dir, tmp), int(meta['embed_dim']), args.threads)
        check = check_against_clipserve(model, args.export_dir, (args.text, *CHECK_TEXTS))
        print(json.dumps(check), flush=True)
        if check['min_cosine'] < 0.9999 or not check['tokens_equal']:
            sys.exit(f'FastEmbed does not compute what clipserve does on this export: {check}')
        if not args.serve:
            rate = texts_per_second(model, args.text, args.batch, args.seconds)
            print(json.dumps({'texts_per_s': rate, 'batch': args.batch}), flush=True)
            return
        for line in sys.stdin:
            if line.strip():
                rate = texts_per_second(model, args.text, args.batch, float(line))
                print(json.dumps({'texts_per_s': rate, 'batch': args.batch}), flush=True)


if __name__ == '__main__':
    main()
