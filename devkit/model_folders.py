"""Model folders the tests build themselves (no network): open_clip's local-dir layout with a shrunk
config of a real family, seeded random weights and a tokenizer trained here with `tokenizers`.

    folder/open_clip_config.json        {"model_cfg": ..., "preprocess_cfg": ...}
    folder/open_clip_model.safetensors  the weights
    folder/tokenizer.json, tokenizer_config.json, special_tokens_map.json
"""

from __future__ import annotations

import json
from pathlib import Path

CORPUS = [
    'a photo of a cat',
    'two dogs playing in the snow',
    'a diagram of a transformer network',
    'café crème brûlée à la carte, naïve façade',
    'Ärger über Öl und Übermut',
    '東京の夜景 北京烤鸭 서울의 밤',
    'emoji 🐶 🐱 🎉 and symbols © ™ €',
    'the quick brown fox jumps over the lazy dog',
    'an underscore_joined_phrase and hyphen-joined words',
    'red green blue yellow purple orange black white',
    'a very long caption describing a crowded street at night with neon signs and wet pavement',
] * 20

SIGLIP_PREPROCESS = {
    'mean': [0.5, 0.5, 0.5],
    'std': [0.5, 0.5, 0.5],
    'interpolation': 'bicubic',
    'resize_mode': 'squash',
}


def _unigram(folder: Path, specials: list, template: str, special: dict, vocab_size: int) -> int:
    """A SentencePiece-style Unigram tokenizer (NFKC, Metaspace) with `template` as its post-processor."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.train_from_iterator(
        CORPUS, trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials, unk_token=special['unk_token'])
    )
    used = [t for t in specials if t in template.split()]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[(t, tokenizer.token_to_id(t)) for t in used]
    )
    tokenizer.save(str(folder / 'tokenizer.json'))
    _write_config(folder, special)
    return tokenizer.get_vocab_size()


def unigram_tokenizer(folder: Path, vocab_size: int = 400) -> int:
    """A T5/SigLIP-style SentencePiece Unigram tokenizer (text </s>; pad = </s>, as SigLIP's)."""
    special = {'pad_token': '</s>', 'eos_token': '</s>', 'unk_token': '<unk>'}
    return _unigram(folder, ['<pad>', '</s>', '<unk>'], '$A </s>', special, vocab_size)


def wordpiece_tokenizer(folder: Path, vocab_size: int = 400) -> int:
    """A BERT-style WordPiece tokenizer ([CLS] ... [SEP], pad [PAD] = 0, lower case), as CLIPA's."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    specials = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']
    tokenizer = Tokenizer(models.WordPiece(unk_token='[UNK]'))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials))
    cls, sep = tokenizer.token_to_id('[CLS]'), tokenizer.token_to_id('[SEP]')
    tokenizer.post_processor = processors.TemplateProcessing(
        single='[CLS] $A [SEP]', special_tokens=[('[CLS]', cls), ('[SEP]', sep)]
    )
    tokenizer.save(str(folder / 'tokenizer.json'))
    config = {'pad_token': '[PAD]', 'cls_token': '[CLS]', 'sep_token': '[SEP]', 'unk_token': '[UNK]'}
    _write_config(folder, config)
    return tokenizer.get_vocab_size()


def xlmr_tokenizer(folder: Path, vocab_size: int = 400) -> int:
    """An XLM-R / XLM-V-style SentencePiece Unigram tokenizer: <s> text </s>, <pad> = 1 (as theirs)."""
    special = {'bos_token': '<s>', 'eos_token': '</s>', 'pad_token': '<pad>', 'unk_token': '<unk>'}
    return _unigram(folder, ['<s>', '<pad>', '</s>', '<unk>'], '<s> $A </s>', special, vocab_size)


def gemma_tokenizer(folder: Path, vocab_size: int = 500) -> int:
    """A Gemma-style BPE tokenizer with byte fallback (<pad> = 0, <eos> = 1, <bos> = 2; '<bos> text <eos>'),
    the kind SigLIP2 ships."""
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
    _write_config(folder, {'bos_token': '<bos>', 'eos_token': '<eos>', 'pad_token': '<pad>', 'unk_token': '<unk>'})
    return tokenizer.get_vocab_size()


def _write_config(folder: Path, special: dict) -> None:
    (folder / 'special_tokens_map.json').write_text(json.dumps(special))
    config = {'tokenizer_class': 'PreTrainedTokenizerFast', 'model_max_length': 512, **special}
    (folder / 'tokenizer_config.json').write_text(json.dumps(config))


def siglip_config(vocab_size: int, tokenizer_kwargs: dict | None = None, context_length: int = 16) -> dict:
    """ViT-B-16-SigLIP's config, shrunk: the same timm MAP-pooled ViT (its tiny size) and the same
    text tower kind (no causal mask, last-token pooling, projection with bias)."""
    return {
        'embed_dim': 192,  # vit_tiny's width: SigLIP's image tower has no projection (timm_proj none)
        'init_logit_bias': -10,
        'custom_text': True,
        'vision_cfg': {
            'image_size': 224,
            'timm_model_name': 'vit_tiny_patch16_224',
            'timm_model_pretrained': False,
            'timm_pool': 'map',
            'timm_proj': 'none',
        },
        'text_cfg': {
            'context_length': context_length,
            'vocab_size': vocab_size,
            'hf_tokenizer_name': 'clipserve-tests/tiny-siglip',
            'tokenizer_kwargs': tokenizer_kwargs if tokenizer_kwargs is not None else {'clean': 'canonicalize'},
            'width': 64,
            'heads': 2,
            'layers': 2,
            'no_causal_mask': True,
            'proj_bias': True,
            'pool_type': 'last',
            'norm_kwargs': {'eps': 1e-6},
        },
    }


def local_dir(folder: Path, model_cfg: dict, preprocess_cfg: dict, seed: int = 0) -> Path:
    """Write open_clip_config.json and seeded random weights for `model_cfg` into `folder`."""
    import open_clip
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / 'open_clip_config.json').write_text(
        json.dumps({'model_cfg': model_cfg, 'preprocess_cfg': preprocess_cfg})
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = open_clip.create_model(f'local-dir:{folder}', pretrained=None, pretrained_text=False)
        with torch.no_grad():  # the init leaves some tensors at zero or one; spread them so that parity means something
            for name, tensor in model.state_dict().items():
                if tensor.is_floating_point() and 'attn_mask' not in name:
                    tensor.add_(torch.randn_like(tensor) * 0.02)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / 'open_clip_model.safetensors'))
    return folder


def siglip_dir(folder: Path, tokenizer: str = 'unigram', tokenizer_kwargs: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    vocab = (unigram_tokenizer if tokenizer == 'unigram' else wordpiece_tokenizer)(folder)
    return local_dir(folder, siglip_config(vocab, tokenizer_kwargs), SIGLIP_PREPROCESS)


TINY_VISION = {'image_size': 224, 'layers': 2, 'width': 64, 'head_width': 32, 'patch_size': 32}
TINY_TEXT = {'width': 64, 'heads': 2, 'layers': 2}


def metaclip2_dir(folder: Path) -> Path:
    """MetaCLIP 2 worldwide's kind, shrunk: open_clip's causal text tower pooled at the </s> id, with an
    XLM-V-style Hugging Face tokenizer (so padding is trimmed although the tokenizer is not BPE)."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = xlmr_tokenizer(folder)
    eos = json.loads((folder / 'tokenizer.json').read_text())['post_processor']['special_tokens']['</s>']['ids'][0]
    text = {
        'hf_tokenizer_name': 'clipserve-tests/tiny-xlm-v',
        'pool_type': 'eos',
        'eos_id': eos,
        'context_length': 16,
        'vocab_size': vocab,
        **TINY_TEXT,
    }
    return local_dir(folder, {'embed_dim': 64, 'vision_cfg': TINY_VISION, 'text_cfg': text}, {})


def tiny_xlmr_config(vocab: int):
    """transformers' XLM-R config at small widths, with xlmr_tokenizer's special ids (<s> 0, <pad> 1, </s> 2)."""
    from transformers import XLMRobertaConfig

    return XLMRobertaConfig(
        vocab_size=vocab,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=80,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )


def xlmr_dir(folder: Path) -> Path:
    """xlm-roberta-base-ViT-B-32's kind, shrunk: a Hugging Face text tower (transformers' XLM-R, from a
    config.json the test writes; `hf_model_name` is its folder) with mean pooling and an MLP projection."""
    folder.mkdir(parents=True, exist_ok=True)
    hf_text = folder / 'hf-text'
    tiny_xlmr_config(xlmr_tokenizer(folder)).save_pretrained(hf_text)
    text = {
        'hf_model_name': str(hf_text),
        'hf_tokenizer_name': 'clipserve-tests/tiny-xlmr',
        'hf_pooler_type': 'mean_pooler',
        'hf_model_pretrained': False,
    }
    return local_dir(folder, {'embed_dim': 64, 'vision_cfg': TINY_VISION, 'text_cfg': text}, {})


def clipa_dir(folder: Path) -> Path:
    """CLIPA's kind, shrunk: a BERT WordPiece tokenizer with [SEP] stripped, no causal mask, last-token pooling."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = wordpiece_tokenizer(folder)
    text = {
        'context_length': 16,
        'vocab_size': vocab,
        'hf_tokenizer_name': 'clipserve-tests/tiny-bert',
        'tokenizer_kwargs': {'strip_sep_token': True},
        'pool_type': 'last',
        'no_causal_mask': True,
        **TINY_TEXT,
    }
    return local_dir(folder, {'embed_dim': 64, 'vision_cfg': TINY_VISION, 'text_cfg': text}, {})


def pecore_dir(folder: Path) -> Path:
    """PE-Core's text side, shrunk: open_clip's BPE with a context of 32 (not 77)."""
    text = {'context_length': 32, 'vocab_size': 49408, **TINY_TEXT}
    return local_dir(folder, {'embed_dim': 64, 'vision_cfg': TINY_VISION, 'text_cfg': text}, SQUASH)


def mobileclip2_dir(folder: Path) -> Path:
    """MobileCLIP2's text side, shrunk: open_clip's BPE, but no causal mask, so never trimmed (77 tokens)."""
    text = {'context_length': 77, 'vocab_size': 49408, 'no_causal_mask': True, **TINY_TEXT}
    mean_std = {'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'interpolation': 'bilinear'}
    return local_dir(folder, {'embed_dim': 64, 'vision_cfg': TINY_VISION, 'text_cfg': text}, mean_std)


SQUASH = {'resize_mode': 'squash', 'interpolation': 'bilinear'}


def siglip2_dir(folder: Path) -> Path:
    """SigLIP2's kind, shrunk: SigLIP's towers with tanh-approximated GELU and a Gemma-style tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    config = siglip_config(gemma_tokenizer(folder))
    config['text_cfg']['act_kwargs'] = {'approximate': 'tanh'}
    return local_dir(folder, config, SIGLIP_PREPROCESS)


FAMILIES = {
    'siglip': siglip_dir,
    'siglip2': siglip2_dir,
    'metaclip2': metaclip2_dir,
    'xlmr': xlmr_dir,
    'clipa': clipa_dir,
    'pecore': pecore_dir,
    'mobileclip2': mobileclip2_dir,
}


# ---- clip-as-service's M-CLIP and CN-CLIP ---------------------------------------------------


def mclip_folder(folder: Path, embed_dim: int = 512) -> Path:
    """An M-CLIP repository's files, shrunk, written by multilingual-clip's own classes: config.json
    (modelBase = a tiny XLM-R saved beside it), model.safetensors, and an XLM-R-style tokenizer."""
    import torch
    from multilingual_clip import Config_MCLIP, pt_multilingual_clip
    from transformers import XLMRobertaModel

    folder.mkdir(parents=True, exist_ok=True)
    base = folder / 'xlm-roberta-tiny'
    config = tiny_xlmr_config(xlmr_tokenizer(folder))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        XLMRobertaModel(config).save_pretrained(base)
        mclip = Config_MCLIP.MCLIPConfig(modelBase=str(base), transformerDimSize=32, imageDimSize=embed_dim)
        pt_multilingual_clip.MultilingualCLIP(mclip).save_pretrained(folder)
    return folder


def mclip_reference(folder: Path):
    """multilingual-clip's own model for `folder`. Its from_pretrained builds under transformers 5's meta
    device and fails, so the package's class is built from the config and given the saved weights."""
    from multilingual_clip import Config_MCLIP, pt_multilingual_clip
    from safetensors.torch import load_file

    model = pt_multilingual_clip.MultilingualCLIP(Config_MCLIP.MCLIPConfig.from_pretrained(str(folder)))
    model.load_state_dict(load_file(str(folder / 'model.safetensors')))
    return model.eval()


def cache_open_clip_weights(cache: Path, arch: str, tag: str, seed: int = 0) -> Path:
    """Seeded random weights for `arch::tag`, where clipserve's cache keeps a download of them (the
    Hugging Face hub layout), so the name loads offline through the real cache path."""
    import open_clip
    import torch
    from safetensors.torch import save_file

    from clipserve.models.families.open_clip_files import hub_files

    repo, names = hub_files(open_clip.get_pretrained_cfg(arch, tag))
    root = cache / f'models--{repo.replace("/", "--")}'
    revision = '0' * 40
    snapshot = root / 'snapshots' / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    (root / 'refs').mkdir(exist_ok=True)
    (root / 'refs' / 'main').write_text(revision)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = open_clip.create_model(arch)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(snapshot / names[0]))
    return snapshot / names[0]


def cnclip_checkpoint(path: Path, struct: str, seed: int = 5) -> Path:
    """A checkpoint in cn_clip's published format ({"state_dict": {"module.<name>": tensor}}), random weights."""
    import contextlib
    import io

    import torch
    from cn_clip.clip.utils import create_model

    with torch.random.fork_rng(devices=[]), contextlib.redirect_stdout(io.StringIO()):
        torch.manual_seed(seed)
        model = create_model(struct)
    state = {f'module.{k}': v for k, v in model.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({'epoch': 1, 'step': 1, 'name': 'clipserve-tests', 'state_dict': state}, path)
    return path
