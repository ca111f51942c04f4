"""transformers checkpoints the tests build themselves (no network), as `save_pretrained` writes them: a tiny
model of each type clipserve serves (`transformers:/folder`), with a tokenizer trained here, and checkpoints
that ship their own model code (in the folder, or in another repository of the hub cache)."""

from __future__ import annotations

import json
from pathlib import Path

from devkit.model_folders import gemma_tokenizer, unigram_tokenizer, wordpiece_tokenizer, xlmr_tokenizer

_TINY_TOWER = {'hidden_size': 32, 'intermediate_size': 64, 'num_hidden_layers': 2, 'num_attention_heads': 2}
_TINY_VISION = {**_TINY_TOWER, 'image_size': 32, 'patch_size': 8}


def _special_ids(folder: Path) -> dict:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / 'tokenizer.json'))
    return {name: tokenizer.token_to_id(token) for name, token in (('bos', '<s>'), ('pad', '<pad>'), ('eos', '</s>'))}


def _tokenizer_config(folder: Path, **values) -> None:
    path = folder / 'tokenizer_config.json'
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))


def transformers_checkpoint(folder: Path, kind: str) -> Path:
    """A transformers checkpoint of `kind` (clip, metaclip_2, siglip, siglip2, chinese_clip, altclip), shrunk: its
    own config class at small widths, random weights saved with save_pretrained, a tokenizer in its style
    trained here, and its image processor's preprocessor_config.json (32 px images; SigLIP2: NaFlex, 8 px
    patches, at most 20 of them, over a learned 4x4 position grid)."""
    import torch
    import transformers as t

    folder.mkdir(parents=True, exist_ok=True)
    square = {'size': {'height': 32, 'width': 32}}
    crop = {'size': {'shortest_edge': 32}, 'crop_size': {'height': 32, 'width': 32}}
    if kind == 'siglip':
        vocab = unigram_tokenizer(folder)
        _tokenizer_config(folder, model_max_length=16)
        eos = _special_ids(folder)['eos']
        text = {**_TINY_TOWER, 'vocab_size': vocab, 'max_position_embeddings': 16}
        text.update(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
        config = t.SiglipConfig(text_config=text, vision_config=_TINY_VISION)
        processor = t.SiglipImageProcessorPil(**square)
    elif kind == 'siglip2':
        vocab = gemma_tokenizer(folder)
        # as google/siglip2-*-naflex ship it (transformers loads it as Siglip2Tokenizer, which lowercases)
        _tokenizer_config(folder, tokenizer_class='GemmaTokenizer', model_max_length=64)
        text = {**_TINY_TOWER, 'vocab_size': vocab, 'max_position_embeddings': 64}
        text.update(pad_token_id=0, eos_token_id=1, bos_token_id=2)
        vision = {**_TINY_TOWER, 'patch_size': 8, 'num_patches': 16}
        config = t.Siglip2Config(text_config=text, vision_config=vision)
        processor = t.Siglip2ImageProcessorPil(patch_size=8, max_num_patches=20)
    elif kind == 'chinese_clip':
        vocab = wordpiece_tokenizer(folder)
        _tokenizer_config(folder, model_max_length=52)
        text = {**_TINY_TOWER, 'vocab_size': vocab, 'max_position_embeddings': 64}
        config = t.ChineseCLIPConfig(text_config=text, vision_config=_TINY_VISION, projection_dim=64)
        processor = t.ChineseCLIPImageProcessorPil(**crop)
    else:
        vocab = xlmr_tokenizer(folder)
        ids = _special_ids(folder)
        specials = {'bos_token_id': ids['bos'], 'pad_token_id': ids['pad'], 'eos_token_id': ids['eos']}
        if kind == 'altclip':
            _tokenizer_config(folder, model_max_length=512)
            text = {**_TINY_TOWER, 'vocab_size': vocab, 'max_position_embeddings': 80, 'project_dim': 64, **specials}
            config = t.AltCLIPConfig(text_config=text, vision_config=_TINY_VISION, projection_dim=64)
        else:
            _tokenizer_config(folder, model_max_length=77)
            text = {**_TINY_TOWER, 'vocab_size': vocab, 'max_position_embeddings': 77, **specials}
            classes = {'clip': t.CLIPConfig, 'metaclip_2': t.MetaClip2Config}
            config = classes[kind](text_config=text, vision_config=_TINY_VISION, projection_dim=64)
        processor = t.CLIPImageProcessorPil(**crop)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        t.AutoModel.from_config(config).save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


TRANSFORMERS_TYPES = ('clip', 'metaclip_2', 'siglip', 'siglip2', 'chinese_clip', 'altclip')


REMOTE_MODEL_CODE = '''"""A tiny CLIP-like model shipped as code with its checkpoint (written by clipserve's tests)."""
import torch
from transformers import PretrainedConfig, PreTrainedModel


class TinyRemoteConfig(PretrainedConfig):
    model_type = 'tiny_remote_clip'

    def __init__(self, vocab_size=400, width=32, projection_dim=64, patch_size=8, matryoshka_dimensions=None, **kw):
        super().__init__(**kw)
        self.vocab_size, self.width, self.projection_dim = vocab_size, width, projection_dim
        self.patch_size, self.matryoshka_dimensions = patch_size, matryoshka_dimensions


class TinyRemoteCLIP(PreTrainedModel):
    config_class = TinyRemoteConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = torch.nn.Embedding(config.vocab_size, config.width)
        self.text_proj = torch.nn.Linear(config.width, config.projection_dim)
        self.patch = torch.nn.Conv2d(3, config.width, config.patch_size, config.patch_size)
        self.image_proj = torch.nn.Linear(config.width, config.projection_dim)
        self.post_init()

    def get_text_features(self, input_ids, attention_mask=None):
        x = self.embed(input_ids)
        mask = (torch.ones_like(input_ids) if attention_mask is None else attention_mask).unsqueeze(-1).to(x.dtype)
        return self.text_proj((x * mask).sum(1) / mask.sum(1))

    def get_image_features(self, pixel_values):
        return self.image_proj(self.patch(pixel_values).flatten(2).mean(-1))
'''


def remote_code_checkpoint(folder: Path) -> Path:
    """A checkpoint with its own model code (config.json's auto_map -> modeling_tiny.py beside it), Matryoshka-
    trained for 16, 32 and 64 dimensions, as Jina CLIP v2 and other remote-code models ship."""
    import importlib.util

    import torch
    from transformers import CLIPImageProcessorPil

    folder.mkdir(parents=True, exist_ok=True)
    code = folder / 'modeling_tiny.py'
    code.write_text(REMOTE_MODEL_CODE)
    spec = importlib.util.spec_from_file_location('clipserve_tests_modeling_tiny', code)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    vocab = xlmr_tokenizer(folder)
    _tokenizer_config(folder, model_max_length=32)
    config = module.TinyRemoteConfig(vocab_size=vocab, matryoshka_dimensions=[16, 32, 64])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        module.TinyRemoteCLIP(config).save_pretrained(folder)
    saved = json.loads((folder / 'config.json').read_text())
    saved['auto_map'] = {'AutoConfig': 'modeling_tiny.TinyRemoteConfig', 'AutoModel': 'modeling_tiny.TinyRemoteCLIP'}
    (folder / 'config.json').write_text(json.dumps(saved))
    CLIPImageProcessorPil(size={'shortest_edge': 32}, crop_size={'height': 32, 'width': 32}).save_pretrained(folder)
    return folder


def remote_code_in_another_repository(
    folder: Path, cache: Path, repo: str = 'clipserve-tests/tiny-implementation'
) -> Path:
    """remote_code_checkpoint whose code lives in another hub repository (auto_map 'repo--module.Class', as Jina
    CLIP v2's points into jinaai/jina-clip-implementation), that repository laid out in the hub cache `cache`."""
    remote_code_checkpoint(folder)
    snapshot = cache / f'models--{repo.replace("/", "--")}' / 'snapshots' / ('0' * 40)
    snapshot.mkdir(parents=True)
    (snapshot.parent.parent / 'refs').mkdir()
    (snapshot.parent.parent / 'refs' / 'main').write_text('0' * 40)
    (folder / 'modeling_tiny.py').rename(snapshot / 'modeling_tiny.py')
    config = json.loads((folder / 'config.json').read_text())
    config['auto_map'] = {key: f'{repo}--{value}' for key, value in config['auto_map'].items()}
    (folder / 'config.json').write_text(json.dumps(config))
    return folder


def cross_encoder_checkpoint(folder: Path, kind: str = 'xlm-roberta', seed: int = 11) -> Path:
    """A tiny reranker, as save_pretrained writes one: `XLMRobertaForSequenceClassification` (bge-reranker's
    kind: `<s> q </s></s> d </s>`) or `BertForSequenceClassification` (ms-marco MiniLM's: `[CLS] q [SEP] d [SEP]`
    with segment ids), one label, random weights, a tokenizer trained here with the pair template theirs have."""
    import torch
    import transformers as t
    from tokenizers import Tokenizer, processors

    folder.mkdir(parents=True, exist_ok=True)
    small = {
        'hidden_size': 32,
        'num_hidden_layers': 2,
        'num_attention_heads': 2,
        'intermediate_size': 48,
        'num_labels': 1,
    }
    small['initializer_range'] = 0.3  # scores that differ from pair to pair (the default 0.02 gives ~0 for all)
    if kind == 'bert':
        vocab = wordpiece_tokenizer(folder)
        tokenizer = Tokenizer.from_file(str(folder / 'tokenizer.json'))
        cls, sep = tokenizer.token_to_id('[CLS]'), tokenizer.token_to_id('[SEP]')
        tokenizer.post_processor = processors.TemplateProcessing(
            single='[CLS] $A [SEP]', pair='[CLS] $A [SEP] $B:1 [SEP]:1', special_tokens=[('[CLS]', cls), ('[SEP]', sep)]
        )
        tokenizer.save(str(folder / 'tokenizer.json'))
        _tokenizer_config(
            folder, model_max_length=64, model_input_names=['input_ids', 'token_type_ids', 'attention_mask']
        )
        config = t.BertConfig(vocab_size=vocab, max_position_embeddings=64, type_vocab_size=2, **small)
        model_class = t.BertForSequenceClassification
    else:
        vocab = xlmr_tokenizer(folder)
        tokenizer = Tokenizer.from_file(str(folder / 'tokenizer.json'))
        ids = _special_ids(folder)
        tokenizer.post_processor = processors.RobertaProcessing(('</s>', ids['eos']), ('<s>', ids['bos']))
        tokenizer.save(str(folder / 'tokenizer.json'))
        _tokenizer_config(folder, model_max_length=64)
        config = t.XLMRobertaConfig(
            vocab_size=vocab,
            max_position_embeddings=66,
            type_vocab_size=1,
            pad_token_id=ids['pad'],
            bos_token_id=ids['bos'],
            eos_token_id=ids['eos'],
            **small,
        )
        model_class = t.XLMRobertaForSequenceClassification
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model_class(config).save_pretrained(folder)
    return folder
