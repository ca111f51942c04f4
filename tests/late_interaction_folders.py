"""Late-interaction checkpoints the tests build themselves (no network): a tiny ColPali (PaliGemma: SigLIP +
Gemma) and a tiny ColQwen2 (Qwen2-VL), each from transformers' own config classes at small widths, with random
weights saved by save_pretrained, a tokenizer in its style trained here, and its processor (transformers'
ColPaliProcessor / ColQwen2Processor with the PIL image processors) saved beside them, as the hub's
`vidore/colpali-v1.3-hf` and `vidore/colqwen2-v1.0-hf` ship theirs."""

from __future__ import annotations

import json
from pathlib import Path

from devkit.model_folders import CORPUS, gemma_tokenizer

LATE_TYPES = ('colpali', 'colqwen2')
EMBEDDING_DIM = 16
_TINY = {'hidden_size': 32, 'intermediate_size': 64, 'num_hidden_layers': 2, 'num_attention_heads': 2}
QWEN_SPECIALS = [
    '<|endoftext|>',
    '<|im_start|>',
    '<|im_end|>',
    '<|vision_start|>',
    '<|vision_end|>',
    '<|image_pad|>',
    '<|video_pad|>',
]


def qwen2_tokenizer(folder: Path, vocab_size: int = 600) -> None:
    """A Qwen2-style byte-level BPE (no BOS; <|endoftext|> is the pad token) with Qwen2-VL's vision tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tokenizer.train_from_iterator(
        CORPUS, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=QWEN_SPECIALS, initial_alphabet=alphabet)
    )
    tokenizer.save(str(folder / 'tokenizer.json'))
    config = {'tokenizer_class': 'Qwen2Tokenizer', 'pad_token': '<|endoftext|>', 'eos_token': '<|im_end|>'}
    (folder / 'tokenizer_config.json').write_text(json.dumps({**config, 'model_max_length': 32768}))


def _processor(folder: Path, kind: str):
    import transformers as t

    if kind == 'colpali':
        gemma_tokenizer(folder)
        path = folder / 'tokenizer_config.json'
        path.write_text(json.dumps({**json.loads(path.read_text()), 'tokenizer_class': 'GemmaTokenizer'}))
        image = t.SiglipImageProcessorPil(size={'height': 32, 'width': 32}, image_seq_length=16)
        return t.ColPaliProcessor(image_processor=image, tokenizer=t.AutoTokenizer.from_pretrained(str(folder)))
    qwen2_tokenizer(folder)
    # 4 px patches merged 2 x 2: images of 256 to 1,024 pixels, 16 to 64 patches (4 to 16 image tokens)
    image = t.Qwen2VLImageProcessorPil(
        patch_size=4, merge_size=2, temporal_patch_size=2, min_pixels=256, max_pixels=1024
    )
    return t.ColQwen2Processor(image_processor=image, tokenizer=t.AutoTokenizer.from_pretrained(str(folder)))


def _config(kind: str, processor):
    import transformers as t

    tokenizer = processor.tokenizer
    ids = {'pad_token_id': tokenizer.pad_token_id, 'eos_token_id': tokenizer.eos_token_id}
    if kind == 'colpali':
        text = t.GemmaConfig(
            **_TINY,
            num_key_value_heads=1,
            head_dim=16,
            vocab_size=len(tokenizer),
            bos_token_id=tokenizer.bos_token_id,
            **ids,
        )
        vision = t.SiglipVisionConfig(**_TINY, image_size=32, patch_size=8)
        vlm = t.PaliGemmaConfig(
            vision_config=vision.to_dict(),
            text_config=text.to_dict(),
            image_token_id=processor.image_token_id,
            projection_dim=32,
        )
        return t.ColPaliConfig(vlm_config=vlm.to_dict(), embedding_dim=EMBEDDING_DIM)
    token = tokenizer.convert_tokens_to_ids
    rope = {'rope_type': 'default', 'mrope_section': [2, 3, 3], 'rope_theta': 10000.0}
    text = {**_TINY, 'num_key_value_heads': 1, 'vocab_size': len(tokenizer), 'rope_parameters': rope, **ids}
    text['bos_token_id'] = ids['pad_token_id']
    vision = {'depth': 2, 'embed_dim': 16, 'hidden_size': 32, 'num_heads': 2, 'patch_size': 4}
    vision.update(spatial_merge_size=2, temporal_patch_size=2)
    vlm = t.Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=token('<|image_pad|>'),
        video_token_id=token('<|video_pad|>'),
        vision_start_token_id=token('<|vision_start|>'),
        vision_end_token_id=token('<|vision_end|>'),
    )
    return t.ColQwen2Config(vlm_config=vlm.to_dict(), embedding_dim=EMBEDDING_DIM)


def late_interaction_checkpoint(folder: Path, kind: str, seed: int = 5) -> Path:
    """A tiny `kind` ('colpali' or 'colqwen2') checkpoint in `folder`, as save_pretrained writes it."""
    import torch
    import transformers as t

    folder.mkdir(parents=True, exist_ok=True)
    processor = _processor(folder, kind)
    processor.save_pretrained(str(folder))
    model_class = t.ColPaliForRetrieval if kind == 'colpali' else t.ColQwen2ForRetrieval
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model_class(_config(kind, processor)).save_pretrained(str(folder))
    return folder


def reference(folder: Path, kind: str):
    """transformers' own (processor with its PIL image processor, model) for the checkpoint in `folder`."""
    import transformers as t

    if kind == 'colpali':
        image = t.SiglipImageProcessorPil.from_pretrained(str(folder))
        processor = t.ColPaliProcessor.from_pretrained(str(folder), image_processor=image)
        return processor, t.ColPaliForRetrieval.from_pretrained(str(folder)).eval()
    image = t.Qwen2VLImageProcessorPil.from_pretrained(str(folder))
    processor = t.ColQwen2Processor.from_pretrained(str(folder), image_processor=image)
    return processor, t.ColQwen2ForRetrieval.from_pretrained(str(folder)).eval()
