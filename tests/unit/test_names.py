import pytest

from clipserve.errors import UnknownModelError
from clipserve.models.names import DEFAULT_MODEL, LEGACY_ALIASES, ModelName, parse_model_name


@pytest.mark.parametrize(
    'name, arch, pretrained',
    [
        ('ViT-B-32::openai', 'ViT-B-32', 'openai'),
        ('ViT-B-32::laion2b_s34b_b79k', 'ViT-B-32', 'laion2b_s34b_b79k'),
        ('ViT-B/32', 'ViT-B-32', 'openai'),
        ('ViT-L/14@336px', 'ViT-L-14-336', 'openai'),
        ('RN50x64', 'RN50x64', 'openai'),
        ('RN50', 'RN50', 'openai'),
        ('ViT-B-16', 'ViT-B-16', 'openai'),
        ('ViT-B-32::random', 'ViT-B-32', 'random'),
        ('ViT-B-32::/tmp/w.safetensors', 'ViT-B-32', '/tmp/w.safetensors'),
        ('/cfg/my-arch.json::random', '/cfg/my-arch.json', 'random'),
        (None, 'ViT-B-32', 'openai'),
        ('', 'ViT-B-32', 'openai'),
    ],
)
def test_parse(name, arch, pretrained):
    parsed = parse_model_name(name)
    assert (parsed.arch, parsed.pretrained) == (arch, pretrained)


def test_every_legacy_alias_parses_to_openai():
    assert len(LEGACY_ALIASES) == 9
    for alias in LEGACY_ALIASES:
        assert parse_model_name(alias).pretrained == 'openai'


def test_kinds():
    assert ModelName('ViT-B-32', 'random').is_random
    assert ModelName('ViT-B-32', 'w.bin').checkpoint_path == 'w.bin'
    assert ModelName('ViT-B-32', 'openai').checkpoint_path is None
    assert ModelName('x.json', 'random').config_path == 'x.json'
    assert str(parse_model_name(None)) == DEFAULT_MODEL


def test_unknown_architecture_lists_close_matches():
    from clipserve.models.registry import resolve

    with pytest.raises(UnknownModelError, match='ViT-B-32') as err:
        resolve(parse_model_name('ViT-B-23::openai'))
    assert 'Did you mean' in str(err.value)


def test_unknown_tag_lists_known_tags():
    from clipserve.models.registry import resolve

    with pytest.raises(UnknownModelError, match='laion2b_s34b_b79k'):
        resolve(parse_model_name('ViT-B-32::laion2b_s34b'))


def test_clip_as_service_dashed_tags_resolve():
    from clipserve.models.registry import resolve

    resolved = resolve(parse_model_name('ViT-B-32::laion2b-s34b-b79k'))
    assert resolved.pretrained_cfg['hf_hub'].startswith('laion/')


@pytest.mark.parametrize(
    'name, quick_gelu',
    [
        ('ViT-B-32::openai', True),
        ('ViT-B-32::laion400m_e32', True),
        ('ViT-B-32::laion2b_s34b_b79k', False),
        ('ViT-B-32::random', False),
    ],
)
def test_activation_follows_the_weights(name, quick_gelu):
    from clipserve.models.registry import resolve

    assert resolve(parse_model_name(name)).quick_gelu is quick_gelu


def test_preprocess_config_comes_from_the_model():
    from clipserve.models.registry import resolve

    assert resolve(parse_model_name('RN50x4::openai')).preprocess.image_size == 288
    laion = resolve(parse_model_name('ViT-B-32-256::datacomp_s34b_b86k'))
    assert laion.preprocess.image_size == 256
