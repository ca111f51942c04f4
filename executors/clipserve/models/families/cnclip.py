"""Chinese-CLIP (CN-CLIP) by clip-as-service's five names, as the `cn-clip` package defines the models.

The torch path builds them with `cn_clip`'s own model code and checkpoints (extra `cn-clip`), so the
embeddings are the package's. Texts are tokenized as `cn_clip.clip.tokenize` does (its Chinese BERT
WordPiece vocabulary, lower-cased, `[CLS] ... [SEP]`, 52 tokens); clipserve reads that vocabulary
with the `tokenizers` library, from a `tokenizer.json` it writes once from the package's `vocab.txt`,
and the exporter puts that file beside the ONNX graphs (so an ONNX replica needs no cn_clip, torch or
transformers). BERT attends only to unmasked tokens and CN-CLIP pools at `[CLS]`, so batches run
only up to their longest text. Images are squashed to the model's square size (bicubic), as
`cn_clip.clip.image_transform` does.

    CN-CLIP/ViT-B-16                           the published weights (cached, downloaded once)
    CN-CLIP/ViT-B-16::/path/clip_cn_vit-b-16.pt   a local checkpoint
    CN-CLIP/RN50::random                       seeded random weights (smoke runs)
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from clipserve.errors import BackendUnavailableError, UnknownModelError, WeightsUnavailableError
from clipserve.models.cache import CACHE_ENV, cache_dir
from clipserve.models.dtypes import TORCH_DTYPES
from clipserve.models.hf_tokenizer import TOKENIZER_FILE
from clipserve.models.hub import HubFileUnavailable, hub_file
from clipserve.models.names import CNCLIP_FAMILY, ModelName
from clipserve.models.preprocess import PreprocessConfig
from clipserve.models.resolved import ResolvedModel
from clipserve.models.text_spec import HF_TOKENIZER, TextSpec

FAMILY = CNCLIP_FAMILY
CONTEXT_LENGTH = 52  # cn_clip.clip.tokenize's default, which every published model was trained with
VOCAB_FILE = 'vocab.txt'
TOKENIZER_CONFIG = 'tokenizer_config.json'
MAX_CHARS_PER_WORD = 200  # cn_clip's WordpieceTokenizer (the tokenizers library defaults to 100)
RANDOM_SEED = 0


@dataclass(frozen=True)
class CnclipModel:
    struct: str  # cn_clip's '<vision config>@<text config>'
    image_size: int
    embed_dim: int
    repo: str  # the Hugging Face repository that holds the cn_clip checkpoint
    checkpoint: str


MODELS = {
    'CN-CLIP/ViT-B-16': CnclipModel(
        'ViT-B-16@RoBERTa-wwm-ext-base-chinese',
        224,
        512,
        'OFA-Sys/chinese-clip-vit-base-patch16',
        'clip_cn_vit-b-16.pt',
    ),
    'CN-CLIP/ViT-L-14': CnclipModel(
        'ViT-L-14@RoBERTa-wwm-ext-base-chinese',
        224,
        768,
        'OFA-Sys/chinese-clip-vit-large-patch14',
        'clip_cn_vit-l-14.pt',
    ),
    'CN-CLIP/ViT-L-14-336': CnclipModel(
        'ViT-L-14-336@RoBERTa-wwm-ext-base-chinese',
        336,
        768,
        'OFA-Sys/chinese-clip-vit-large-patch14-336px',
        'clip_cn_vit-l-14-336.pt',
    ),
    'CN-CLIP/ViT-H-14': CnclipModel(
        'ViT-H-14@RoBERTa-wwm-ext-large-chinese',
        224,
        1024,
        'OFA-Sys/chinese-clip-vit-huge-patch14',
        'clip_cn_vit-h-14.pt',
    ),
    'CN-CLIP/RN50': CnclipModel('RN50@RBT3-chinese', 224, 1024, 'OFA-Sys/chinese-clip-rn50', 'clip_cn_rn50.pt'),
}
TEXT = TextSpec(
    tokenizer=HF_TOKENIZER,
    context_length=CONTEXT_LENGTH,
    clean='none',
    causal=True,
    hf_tokenizer_name='cn_clip vocab.txt',
    vocab_size=21128,
)


def lookup(name: ModelName) -> CnclipModel:
    model = MODELS.get(name.arch)
    if model is None:
        raise UnknownModelError(
            f'unknown Chinese-CLIP model {name.arch!r}; known: {", ".join(MODELS)} '
            '(`python -m clipserve models --family CN-CLIP`)'
        )
    return model


def preprocess(model: CnclipModel) -> PreprocessConfig:
    """cn_clip.clip.image_transform: a bicubic resize to the square size (no crop), OpenAI's mean and std."""
    return PreprocessConfig(image_size=model.image_size, interpolation='bicubic', resize_mode='squash')


def resolve(name: ModelName) -> ResolvedModel:
    model = lookup(name)
    return ResolvedModel(
        name=name,
        arch=name.arch,
        model_cfg={'embed_dim': model.embed_dim, 'struct': model.struct},
        pretrained_cfg={} if name.is_random or name.checkpoint_path else {'hf_hub': f'{model.repo}/{model.checkpoint}'},
        quick_gelu=False,
        preprocess=preprocess(model),
        text=TEXT,
        family=CNCLIP_FAMILY,
    )


def _cn_clip():
    try:
        import cn_clip.clip
        import cn_clip.clip.utils
    except ImportError as e:
        raise BackendUnavailableError(
            "Chinese-CLIP's torch models are cn_clip's: pip install 'clipserve[cn-clip]' (or export the model once "
            'and serve the ONNX files, which need no cn_clip)'
        ) from e
    return cn_clip.clip


def checkpoint_file(resolved) -> Path:
    """The checkpoint the name gives, else the published one from the cache (downloaded once)."""
    model = lookup(resolved.name)
    local = resolved.name.checkpoint_path
    if local is not None:
        path = Path(local).expanduser()
        if not path.is_file():
            raise WeightsUnavailableError(f'checkpoint file {str(path)!r} (from {str(resolved.name)!r}) does not exist')
        return path
    try:
        return hub_file(model.repo, (model.checkpoint,))
    except HubFileUnavailable as e:
        raise WeightsUnavailableError(
            f'cannot get the weights of {resolved.name} ({model.repo}/{model.checkpoint}): {e}. They download on '
            f'first use into the cache {str(cache_dir())!r} (set ${CACHE_ENV} to move it), which needs network '
            f'access. Offline, copy a cache that has them, or copy {model.checkpoint} anywhere and serve '
            f'"{resolved.arch}::/path/to/{model.checkpoint}"'
        ) from e


def build(resolved, device: str, precision: str) -> torch.nn.Module:
    """cn_clip's model with the checkpoint's weights (or seeded random ones), in eval mode."""
    clip = _cn_clip()
    model = lookup(resolved.name)
    checkpoint = None
    if not resolved.name.is_random:
        path = checkpoint_file(resolved)
        try:
            checkpoint = torch.load(str(path), map_location='cpu', weights_only=True)  # no pickled code
            if not isinstance(checkpoint, dict) or 'state_dict' not in checkpoint:
                raise ValueError('not a cn_clip checkpoint (a dict with "state_dict")')
        except Exception as e:
            raise WeightsUnavailableError(f'cannot read the checkpoint {str(path)!r}: {type(e).__name__}: {e}') from e
    with torch.random.fork_rng(devices=[]), contextlib.redirect_stdout(io.StringIO()):  # cn_clip prints its configs
        torch.manual_seed(RANDOM_SEED)
        try:
            built = clip.utils.create_model(model.struct, checkpoint)
        except RuntimeError as e:
            raise WeightsUnavailableError(f'the checkpoint does not fit {resolved.name}: {e}') from e
    dtype = TORCH_DTYPES[precision]
    # cn_clip keeps its fp16-converted weights on a GPU and makes them float on a CPU; clipserve's dtype decides
    wrapped = ChineseCLIP(built.float()).to(device=device, dtype=dtype).eval()
    for parameter in wrapped.parameters():
        parameter.requires_grad_(False)
    return wrapped


class ChineseCLIP(torch.nn.Module):
    """cn_clip's CLIP behind the towers' interface (its text tower derives the mask from [PAD] = 0 itself)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.visual = model.visual

    def encode_image(self, pixel_values):
        return self.model.encode_image(pixel_values)

    def encode_text_with_mask(self, input_ids, attention_mask):
        return self.model.encode_text(input_ids)


def write_tokenizer(vocab: Path, folder: Path) -> None:
    """`tokenizer.json` + `tokenizer_config.json` reading `vocab` as cn_clip's FullTokenizer does."""
    from tokenizers import BertWordPieceTokenizer

    tokenizer = BertWordPieceTokenizer(
        str(vocab), clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    tokenizer._tokenizer.model.max_input_chars_per_word = MAX_CHARS_PER_WORD
    tokenizer.save(str(folder / TOKENIZER_FILE))
    config = {'pad_token': '[PAD]', 'unk_token': '[UNK]', 'cls_token': '[CLS]', 'sep_token': '[SEP]'}
    (folder / TOKENIZER_CONFIG).write_text(json.dumps({**config, 'model_max_length': CONTEXT_LENGTH}))
    shutil.copyfile(vocab, folder / VOCAB_FILE)


def tokenizer_folder(resolved) -> Path:
    """A folder with the tokenizer files for cn_clip's vocabulary, written once into the cache."""
    vocab = Path(_cn_clip().bert_tokenizer.default_vocab())
    digest = hashlib.sha256(vocab.read_bytes()).hexdigest()[:16]
    for parent in (cache_dir() / 'cn-clip-tokenizer', Path(tempfile.gettempdir()) / 'clipserve-cn-clip-tokenizer'):
        target = parent / digest
        if (target / TOKENIZER_FILE).is_file():
            return target
        try:
            parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=parent, prefix='.write-') as tmp:
                write_tokenizer(vocab, Path(tmp))
                with contextlib.suppress(OSError):  # another process won the race: its copy is the same
                    os.rename(tmp, target)
                    os.makedirs(tmp)  # so TemporaryDirectory's cleanup finds something to remove
            return target
        except OSError:
            continue  # a read-only cache: the temporary folder
    raise WeightsUnavailableError('cannot write the CN-CLIP tokenizer files into the cache or a temporary folder')
