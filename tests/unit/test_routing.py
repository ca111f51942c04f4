"""Multi-model routing on its own (the same rules run through real multi-model Flows in
tests/integration/test_serving_flows.py)."""

import pytest

from clipserve.errors import UnknownModelError
from clipserve.serving.replica.routing import PASS_THROUGH, model_routes

ENCODE, RANK, INFO, READY, DEFAULT = 'encode', 'rank', 'info', 'ready', 'default'
REQUESTS = {'/encode': ENCODE, '/rank': RANK, '/clipserve/info': INFO, '/clipserve/ready': READY, '/default': DEFAULT}
SERVED = ['ViT-B-32::openai', 'ViT-L-14::openai']


def routes(model='ViT-B-32::openai', configured='ViT-B/32', serve_default=True):
    return model_routes(REQUESTS, ('/encode', '/rank'), model, configured, SERVED, serve_default)


def test_the_own_model_under_any_of_its_names_gets_the_handler():
    table = routes()
    for name in ('ViT-B-32::openai', 'ViT-B/32', 'ViT-B-32'):
        assert table[f'/encode/{name}'] == ENCODE and table[f'/rank/{name}'] == RANK
        assert f'/encode/{name}' in table


def test_another_served_model_passes_through_an_unknown_one_is_an_error_naming_the_served_models():
    table = routes()
    assert table['/encode/ViT-L-14::openai'] is PASS_THROUGH and table['/rank/ViT-L/14'] is PASS_THROUGH
    unknown = table['/encode/ViT-B-23']
    with pytest.raises(
        UnknownModelError,
        match="'ViT-B-23' is not served by this Flow; served models: ViT-B-32::openai, ViT-L-14::openai",
    ):
        unknown.fn(None)
    assert table['/default'] == DEFAULT and table['/encode'] == ENCODE


def test_an_extra_models_executor_keeps_only_its_own_routes_and_passes_everything_else():
    table = routes('ViT-L-14::openai', 'ViT-L-14::openai', serve_default=False)
    assert table['/encode/ViT-L/14'] == ENCODE
    assert table['/encode/ViT-B-32::openai'] is PASS_THROUGH and table['/encode/nonsense'] is PASS_THROUGH
    assert table['/clipserve/info'] == INFO and table['/clipserve/ready'] == READY
    assert '/default' not in table and '/encode' not in table
    with pytest.raises(KeyError):
        table['/search']


def test_clip_as_service_names_with_a_slash_route_as_a_whole():
    """clip-client sends `/encode/M-CLIP/XLM-Roberta-Large-Vit-B-32`: the model is everything after the endpoint."""
    served = ['M-CLIP/XLM-Roberta-Large-Vit-B-32', 'CN-CLIP/RN50']
    table = model_routes(REQUESTS, ('/encode', '/rank'), served[0], served[0], served, True)
    assert table['/encode/M-CLIP/XLM-Roberta-Large-Vit-B-32'] == ENCODE
    assert table['/rank/CN-CLIP/RN50'] is PASS_THROUGH
    with pytest.raises(UnknownModelError, match="'CN-CLIP/ViT-B-32' is not served by this Flow"):
        table['/encode/CN-CLIP/ViT-B-32'].fn(None)
