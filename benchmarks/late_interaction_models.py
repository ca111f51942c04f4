"""Checkpoints, inputs and transformers' reference for benchmarks/late_interaction.py: ColPali / ColQwen2.

    .venv/bin/python -m benchmarks.late_interaction_models KIND SIZE FOLDER [--dtype bf16]

builds one checkpoint (KIND colpali or colqwen2; SIZE tiny, small or real) into FOLDER as the hub's
`vidore/colpali-v1.3-hf` / `vidore/colqwen2-v1.0-hf` lay theirs out: config.json and safetensors written by
transformers' save_pretrained, the processor (ColPaliProcessor / ColQwen2Processor with the PIL image
processors) beside them, and a tokenizer in the model's style trained here on a few sentences (no network).
The sizes, from transformers' own config classes:

- real: ColQwen2 = Qwen2-VL-2B (text 1536 wide, 8960 MLP, 28 layers, 12 heads, 2 KV heads, vocabulary
  151,936; vision 32 blocks of 1280, 16 heads, 14 px patches merged 2 x 2, temporal patch 2), pages resized
  to at most 768 x 28 x 28 pixels (colpali-engine's max_num_visual_tokens 768); ColPali = PaliGemma-3B
  (SigLIP so400m/14 at 448 px: 1,024 image tokens; Gemma-2B: 2048 wide, 16384 MLP, 18 layers, 8 heads,
  1 KV head of 256, vocabulary 257,216); both project to 128-d vectors. The vocabulary sizes are the real
  ones (the embedding matrices are part of the weights); the tokenizer only uses its first few hundred ids.
- small: 128-d vectors, a few layers of 256, ~256 image tokens per page (for the pooling / storage table).
- tiny: the tests' widths (tests/late_interaction_folders.py), 16-d vectors, at most 16 image tokens.

The model is built directly in the precision asked for (bf16: 4.4 GB for ColQwen2, 5.8 GB for ColPali) and
saved in 2 GB shards, so building the real ColPali holds about 8 GB. It runs in its own process
(`build_in_subprocess`), so the benchmark's own peak memory is the model's as served, not the builder's.
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

KINDS = ('colqwen2', 'colpali')
SIZES = ('tiny', 'small', 'real')
CORPUS = [
    'What was the revenue of the company in 2020?',
    'Quarterly report: net income, operating margin and cash flow by segment',
    'Figure 3 shows the attention map of the transformer layer',
    'Table 2: results on the benchmark, accuracy and recall at ten',
    'café crème brûlée à la carte, naïve façade, Ärger über Öl',
    '東京の夜景 北京烤鸭 서울의 밤',
    'the quick brown fox jumps over the lazy dog',
    'installation guide: remove the cover, connect the cable, press the red button',
    'emoji 🐶 🎉 and symbols © ™ € %',
] * 20
QWEN_SPECIALS = [
    '<|endoftext|>',
    '<|im_start|>',
    '<|im_end|>',
    '<|vision_start|>',
    '<|vision_end|>',
    '<|image_pad|>',
    '<|video_pad|>',
]
WORDS = (
    'revenue profit margin table figure chart energy battery solar wind engine protein cell network '
    'layer attention invoice contract payment delivery safety warning install cable voltage river city '
    'population climate policy market growth decline quarter annual report summary results method'
).split()
REAL_QWEN2 = {
    'text': {
        'hidden_size': 1536,
        'intermediate_size': 8960,
        'num_hidden_layers': 28,
        'num_attention_heads': 12,
        'num_key_value_heads': 2,
        'vocab_size': 151936,
        'max_position_embeddings': 32768,
        'rms_norm_eps': 1e-6,
        'tie_word_embeddings': True,
        'rope_parameters': {'rope_type': 'default', 'mrope_section': [16, 24, 24], 'rope_theta': 1000000.0},
    },
    'vision': {'depth': 32, 'embed_dim': 1280, 'hidden_size': 1536, 'num_heads': 16, 'mlp_ratio': 4},
    'patch': 14,
    'pixels': (56 * 56, 768 * 28 * 28),
}
SMALL_QWEN2 = {
    'text': {
        'hidden_size': 256,
        'intermediate_size': 512,
        'num_hidden_layers': 4,
        'num_attention_heads': 4,
        'num_key_value_heads': 2,
        'rope_parameters': {'rope_type': 'default', 'mrope_section': [8, 12, 12], 'rope_theta': 1000000.0},
    },
    'vision': {'depth': 4, 'embed_dim': 128, 'hidden_size': 256, 'num_heads': 4},
    'patch': 14,
    'pixels': (56 * 56, 256 * 28 * 28),
}
TINY_QWEN2 = {
    'text': {
        'hidden_size': 32,
        'intermediate_size': 64,
        'num_hidden_layers': 2,
        'num_attention_heads': 2,
        'num_key_value_heads': 1,
        'rope_parameters': {'rope_type': 'default', 'mrope_section': [2, 3, 3], 'rope_theta': 10000.0},
    },
    'vision': {'depth': 2, 'embed_dim': 16, 'hidden_size': 32, 'num_heads': 2},
    'patch': 4,
    'pixels': (256, 1024),
}
REAL_PALI = {
    'text': {
        'hidden_size': 2048,
        'intermediate_size': 16384,
        'num_hidden_layers': 18,
        'num_attention_heads': 8,
        'num_key_value_heads': 1,
        'head_dim': 256,
        'vocab_size': 257216,
        'max_position_embeddings': 8192,
    },
    'vision': {'hidden_size': 1152, 'intermediate_size': 4304, 'num_hidden_layers': 27, 'num_attention_heads': 16},
    'image': (448, 14),
}
SMALL_PALI = {
    'text': {'hidden_size': 256, 'intermediate_size': 1024, 'num_hidden_layers': 4, 'num_attention_heads': 4},
    'vision': {'hidden_size': 128, 'intermediate_size': 512, 'num_hidden_layers': 4, 'num_attention_heads': 4},
    'image': (224, 14),
}
TINY_PALI = {
    'text': {'hidden_size': 32, 'intermediate_size': 64, 'num_hidden_layers': 2, 'num_attention_heads': 2},
    'vision': {'hidden_size': 32, 'intermediate_size': 64, 'num_hidden_layers': 2, 'num_attention_heads': 2},
    'image': (32, 8),
}
SPECS = {
    ('colqwen2', 'real'): REAL_QWEN2,
    ('colqwen2', 'small'): SMALL_QWEN2,
    ('colqwen2', 'tiny'): TINY_QWEN2,
    ('colpali', 'real'): REAL_PALI,
    ('colpali', 'small'): SMALL_PALI,
    ('colpali', 'tiny'): TINY_PALI,
}
EMBEDDING_DIM = {'real': 128, 'small': 128, 'tiny': 16}


def _gemma_tokenizer(folder: Path, vocab_size: int = 500) -> None:
    """Gemma-style BPE with byte fallback: <pad> 0, <eos> 1, <bos> 2; '<bos> text <eos>'."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token='<unk>', byte_fallback=True))
    tokenizer.normalizer = normalizers.Replace(' ', '▁')
    tokenizer.pre_tokenizer = pre_tokenizers.Split('▁', behavior='merged_with_previous')
    tokenizer.decoder = decoders.Sequence([decoders.Replace('▁', ' '), decoders.ByteFallback(), decoders.Fuse()])
    specials = ['<pad>', '<eos>', '<bos>', '<unk>'] + [f'<0x{b:02X}>' for b in range(256)]
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=vocab_size + 256, special_tokens=specials))
    bos, eos = tokenizer.token_to_id('<bos>'), tokenizer.token_to_id('<eos>')
    tokenizer.post_processor = processors.TemplateProcessing(
        single='<bos> $A <eos>', special_tokens=[('<bos>', bos), ('<eos>', eos)]
    )
    tokenizer.save(str(folder / 'tokenizer.json'))
    special = {'bos_token': '<bos>', 'eos_token': '<eos>', 'pad_token': '<pad>', 'unk_token': '<unk>'}
    (folder / 'special_tokens_map.json').write_text(json.dumps(special))
    config = {'tokenizer_class': 'GemmaTokenizer', 'model_max_length': 8192, **special}
    (folder / 'tokenizer_config.json').write_text(json.dumps(config))


def _qwen2_tokenizer(folder: Path, vocab_size: int = 600) -> None:
    """Qwen2-style byte-level BPE (no BOS; <|endoftext|> pads) with Qwen2-VL's vision tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=QWEN_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.save(str(folder / 'tokenizer.json'))
    config = {'tokenizer_class': 'Qwen2Tokenizer', 'pad_token': '<|endoftext|>', 'eos_token': '<|im_end|>'}
    (folder / 'tokenizer_config.json').write_text(json.dumps({**config, 'model_max_length': 32768}))


def _processor(folder: Path, kind: str, size: str):
    import transformers as t

    spec = SPECS[kind, size]
    if kind == 'colpali':
        _gemma_tokenizer(folder)
        side, patch = spec['image']
        image = t.SiglipImageProcessorPil(
            size={'height': side, 'width': side}, image_seq_length=(side // patch) ** 2, resample=3
        )
        return t.ColPaliProcessor(image_processor=image, tokenizer=t.AutoTokenizer.from_pretrained(str(folder)))
    _qwen2_tokenizer(folder)
    low, high = spec['pixels']
    image = t.Qwen2VLImageProcessorPil(
        patch_size=spec['patch'], merge_size=2, temporal_patch_size=2, min_pixels=low, max_pixels=high
    )
    return t.ColQwen2Processor(image_processor=image, tokenizer=t.AutoTokenizer.from_pretrained(str(folder)))


def _config(kind: str, size: str, processor):
    import transformers as t

    spec, tokenizer = SPECS[kind, size], processor.tokenizer
    ids = {'pad_token_id': tokenizer.pad_token_id, 'eos_token_id': tokenizer.eos_token_id}
    text = {'vocab_size': len(tokenizer), **spec['text'], **ids}
    if kind == 'colpali':
        text.setdefault('num_key_value_heads', 1)
        text.setdefault('head_dim', text['hidden_size'] // text['num_attention_heads'])
        side, patch = spec['image']
        vision = t.SiglipVisionConfig(**spec['vision'], image_size=side, patch_size=patch, vision_use_head=False)
        vlm = t.PaliGemmaConfig(
            vision_config=vision.to_dict(),
            text_config=t.GemmaConfig(**text, bos_token_id=tokenizer.bos_token_id).to_dict(),
            image_token_id=processor.image_token_id,
            projection_dim=text['hidden_size'],
        )
        return t.ColPaliConfig(vlm_config=vlm.to_dict(), embedding_dim=EMBEDDING_DIM[size])
    token = tokenizer.convert_tokens_to_ids
    text['bos_token_id'] = ids['pad_token_id']
    vision = {**spec['vision'], 'patch_size': spec['patch'], 'spatial_merge_size': 2, 'temporal_patch_size': 2}
    vlm = t.Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=token('<|image_pad|>'),
        video_token_id=token('<|video_pad|>'),
        vision_start_token_id=token('<|vision_start|>'),
        vision_end_token_id=token('<|vision_end|>'),
    )
    return t.ColQwen2Config(vlm_config=vlm.to_dict(), embedding_dim=EMBEDDING_DIM[size])


def build_checkpoint(folder: Path, kind: str, size: str, dtype: str = 'fp32', seed: int = 5) -> Path:
    """A `kind` checkpoint of `size` in `folder`, weights seeded, built and saved in `dtype`."""
    import torch
    import transformers as t

    folder.mkdir(parents=True, exist_ok=True)
    processor = _processor(folder, kind, size)
    processor.save_pretrained(str(folder))
    model_class = t.ColPaliForRetrieval if kind == 'colpali' else t.ColQwen2ForRetrieval
    torch.manual_seed(seed)
    torch_dtype = {'fp32': torch.float32, 'bf16': torch.bfloat16, 'fp16': torch.float16}[dtype]
    model = model_class._from_config(_config(kind, size, processor), dtype=torch_dtype)
    model.save_pretrained(str(folder), max_shard_size='2GB')
    return folder


def build_in_subprocess(folder: Path, kind: str, size: str, dtype: str) -> dict:
    """build_checkpoint in a child process (reused when `folder` already holds one): seconds and peak RSS."""
    weights = ('model.safetensors', 'model.safetensors.index.json')
    if (folder / 'config.json').is_file() and any((folder / name).is_file() for name in weights):
        return {'reused': True}
    started = time.perf_counter()
    command = [sys.executable, __file__, kind, size, str(folder), '--dtype', dtype]
    subprocess.run(command, check=True)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the largest child so far, MB
    return {'seconds': time.perf_counter() - started, 'children_peak_rss_mb': peak}


def pages(count: int, seed: int = 0, width: int = 850, height: int = 1100) -> list[bytes]:
    """JPEG pages: a tinted background, a large figure, a title, then paragraphs, tables and bar charts, varied by seed."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        page = Image.new('RGB', (width, height), tuple(int(c) for c in rng.integers(170, 256, 3)))
        draw = ImageDraw.Draw(page)
        # a large figure somewhere: pages differ even at the tiny models' 32 px
        x0, y0 = int(rng.integers(0, width // 2)), int(rng.integers(0, height // 2))
        box = (x0, y0, x0 + int(rng.integers(width // 5, width // 2)), y0 + int(rng.integers(height // 6, height // 2)))
        figure = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=figure)
        y = 60
        draw.text((60, y), ' '.join(rng.choice(WORDS, 4)).upper(), fill=(0, 0, 0))
        y += 50
        while y < height - 80:
            block = rng.random()
            if block < 0.6:  # a paragraph
                for _ in range(int(rng.integers(3, 9))):
                    draw.text((60, y), ' '.join(rng.choice(WORDS, int(rng.integers(6, 12)))), fill=(20, 20, 20))
                    y += 18
            elif block < 0.8:  # a table
                rows, cols = int(rng.integers(3, 7)), int(rng.integers(2, 6))
                cell = (width - 120) // cols
                for r in range(rows):
                    for c in range(cols):
                        box = (60 + c * cell, y + r * 24, 60 + (c + 1) * cell, y + (r + 1) * 24)
                        draw.rectangle(box, outline=(0, 0, 0))
                        draw.text((box[0] + 4, box[1] + 5), str(rng.choice(WORDS)), fill=(0, 0, 0))
                y += rows * 24
            else:  # a bar chart
                bars = int(rng.integers(3, 10))
                colour = tuple(int(c) for c in rng.integers(0, 200, 3))
                for b in range(bars):
                    tall = int(rng.integers(20, 160))
                    draw.rectangle((80 + b * 50, y + 170 - tall, 110 + b * 50, y + 170), fill=colour)
                y += 180
            y += 30
        buffer = io.BytesIO()
        page.save(buffer, format='JPEG', quality=85)
        out.append(buffer.getvalue())
    return out


def queries(count: int, seed: int = 1) -> list[str]:
    rng = np.random.default_rng(seed)
    starts = ['What is the', 'Where is the', 'Which table shows the', 'How did the', 'Show the']
    return [f'{rng.choice(starts)} {" ".join(rng.choice(WORDS, int(rng.integers(2, 6))))}?' for _ in range(count)]


def reference(folder: Path, kind: str, dtype: str):
    """transformers' own (processor with its PIL image processor, model in `dtype`) for `folder`."""
    import torch
    import transformers as t

    torch_dtype = {'fp32': torch.float32, 'bf16': torch.bfloat16, 'fp16': torch.float16}[dtype]
    if kind == 'colpali':
        image = t.SiglipImageProcessorPil.from_pretrained(str(folder))
        processor = t.ColPaliProcessor.from_pretrained(str(folder), image_processor=image)
        return processor, t.ColPaliForRetrieval.from_pretrained(str(folder), dtype=torch_dtype).eval()
    image = t.Qwen2VLImageProcessorPil.from_pretrained(str(folder))
    processor = t.ColQwen2Processor.from_pretrained(str(folder), image_processor=image)
    return processor, t.ColQwen2ForRetrieval.from_pretrained(str(folder), dtype=torch_dtype).eval()


def transformers_scores(
    folder: Path, kind: str, dtype: str, page_data: list[bytes], texts: list[str], device: str = 'cpu'
) -> np.ndarray:
    """[queries, pages] of transformers' processor.score_retrieval, each query and page embedded alone (as the
    tests do), the model in `dtype` on `device`."""
    import torch
    from PIL import Image

    processor, model = reference(folder, kind, dtype)
    model.to(device)

    def embed(inputs):
        return model(**{k: v.to(device) for k, v in inputs.items()}).embeddings[0].float().cpu()

    with torch.no_grad():
        embedded_queries = [embed(processor.process_queries([q])) for q in texts]
        embedded_pages = [
            embed(processor.process_images([Image.open(io.BytesIO(p)).convert('RGB')])) for p in page_data
        ]
    # in float32 (as `embed` gives them): bf16 scores would round to ties (score_retrieval computes in their dtype)
    scores = [processor.score_retrieval(embedded_queries, [page]) for page in embedded_pages]
    return torch.cat(scores, dim=1).float().numpy()


def compare_orders(reference_scores: np.ndarray, scores: np.ndarray) -> dict:
    """How `scores` ([queries, pages]) orders each query's pages against the reference's order: queries in the
    same order exactly, and up to rounding (every pair of pages swapped has reference scores closer than twice
    the largest difference between the two score matrices)."""
    worst = float(np.abs(scores - reference_scores).max())
    exact = rounding = 0
    for ref, ours in zip(reference_scores, scores):
        if (np.argsort(-ref, kind='stable') == np.argsort(-ours, kind='stable')).all():
            exact += 1
        swapped = (ref[:, None] > ref[None, :]) & (ours[:, None] < ours[None, :])
        rounding += bool((np.abs(ref[:, None] - ref[None, :])[swapped] <= 2 * worst).all())
    relative = worst / max(float(np.abs(reference_scores).max()), 1e-12)
    return {
        'queries': len(scores),
        'orders_equal': exact,
        'equal_up_to_rounding': rounding,
        'max_relative_diff': relative,
    }


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description='build one late-interaction checkpoint with random weights')
    parser.add_argument('kind', choices=KINDS)
    parser.add_argument('size', choices=SIZES)
    parser.add_argument('folder', type=Path)
    parser.add_argument('--dtype', choices=('fp32', 'bf16', 'fp16'), default='fp32')
    args = parser.parse_args()
    build_checkpoint(args.folder, args.kind, args.size, args.dtype)
