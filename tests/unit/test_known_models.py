"""The quick model-name check (models/known_models.py) agrees with the real resolution (models/registry.py):
every name the catalogue lists passes, and every name it refuses the registry refuses too, with a suggestion."""

import pytest

from clipserve.errors import ClipServeError, UnknownModelError
from clipserve.models import registry
from clipserve.models.known_models import check_model_name, rows
from clipserve.models.names import LEGACY_ALIASES, parse_model_name


def test_every_listed_name_and_every_legacy_alias_passes():
    names = [r['name'] for r in rows() if '<' not in r['name']] + list(LEGACY_ALIASES)
    assert len(names) > 200
    for name in names:
        check_model_name(name)


@pytest.mark.parametrize(
    'name, hint',
    [
        ('ViT-B-23::openai', 'Did you mean: ViT-B-32'),
        ('ViT-B-32::opnai', 'Did you mean: openai?'),
        ('vit-b-32::openai', 'Did you mean: ViT-B-32'),
        ('RN50::laion2b', 'Known tags for RN50'),
        ('M-CLIP/XLM-Roberta-Large-Vit-B-33', 'Did you mean: M-CLIP/XLM-Roberta-Large-Vit-B-32'),
        ('CN-CLIP/ViT-X', 'Known: CN-CLIP/'),
        ('/no/such/arch.json::random', 'does not exist'),
        ('local-dir:/no/such/folder', 'does not exist'),
        ('transformers:./no-such-checkpoint', 'does not exist'),
        ('::openai', 'no architecture'),
    ],
)
def test_a_refused_name_is_refused_by_the_registry_too(name, hint):
    with pytest.raises(UnknownModelError, match='') as refused:
        check_model_name(name)
    assert hint in str(refused.value)
    with pytest.raises((ClipServeError, ValueError, OSError)):
        registry.resolve(parse_model_name(name))


def test_a_weights_file_that_is_not_there_is_refused_before_the_load_would_fail():
    with pytest.raises(UnknownModelError, match="weights '/no/such/file.safetensors'"):
        check_model_name('ViT-B-32::/no/such/file.safetensors')


def test_names_the_registry_builds_without_a_listing_pass(tmp_path):
    config = tmp_path / 'arch.json'
    config.write_text('{"embed_dim": 8, "vision_cfg": {}, "text_cfg": {}}')
    weights = tmp_path / 'w.safetensors'
    weights.write_bytes(b'')
    for name in (
        'clipserve-tiny::random',
        f'{config}::random',
        f'ViT-B-32::{weights}',
        'ViT-B-32::laion2b-s34b-b79k',  # clip-as-service's spelling of the tag
        'transformers:google/siglip2-base-patch16-224',  # a hub id: judged when it loads
        f'transformers:{tmp_path}',
        f'local-dir:{tmp_path}',
    ):
        check_model_name(name)
