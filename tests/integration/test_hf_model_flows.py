"""Each model family's shrunk folder (devkit/model_folders.py: SigLIP, SigLIP2, MetaCLIP 2, XLM-R, CLIPA,
PE-Core, MobileCLIP2) served from local-dir by the shipped torch and onnx Flows, through clip-client, against
open_clip itself on the same folder (its model, its tokenizer, its preprocessing)."""

import io

import pytest
from PIL import Image

from devkit.model_folders import FAMILIES

from .conftest import make_image
from .served_pair import assert_encodings_match, assert_rank_matches, clip_scores, torch_and_onnx_flows

open_clip = pytest.importorskip('open_clip')
pytest.importorskip('transformers')
torch = pytest.importorskip('torch')

TEXTS = ['a photo of a cat', 'Café crème — à la carte!', '東京の夜景', ' '.join(['a long caption'] * 30)]


@pytest.fixture(scope='module', params=list(FAMILIES))
def served(request, family_folder, family_export, tmp_path_factory):
    folder = family_folder(request.param)
    exported, _ = family_export(request.param)
    with torch_and_onnx_flows(f'local-dir:{folder}', exported, tmp_path_factory.mktemp('flows')) as ports:
        yield folder, ports


@pytest.fixture(scope='module')
def reference(served):
    folder, _ = served
    model, _, preprocess = open_clip.create_model_and_transforms(f'local-dir:{folder}')
    return model.eval(), preprocess, open_clip.get_tokenizer(f'local-dir:{folder}')


IMAGES = [make_image(300, 200, seed=1), make_image(90, 400, seed=2, fmt='JPEG')]


def test_both_flows_equal_open_clip_through_clip_client(served, reference):
    folder, ports = served
    model, preprocess, tokenizer = reference
    with torch.no_grad():
        want_texts = model.encode_text(tokenizer(TEXTS)).numpy()
        pixels = torch.stack([preprocess(Image.open(io.BytesIO(data))) for data in IMAGES])
        want_images = model.encode_image(pixels).numpy()
    assert_encodings_match(ports, folder.name, TEXTS, IMAGES, want_texts, want_images)


def test_rank_keeps_clip_as_services_score_on_both_flows(served, reference):
    _, ports = served
    model, preprocess, tokenizer = reference
    candidates = ['a photo of a cat', 'a diagram', 'two dogs in the snow']
    with torch.no_grad():
        query = model.encode_image(preprocess(Image.open(io.BytesIO(IMAGES[0])))[None]).numpy()[0]
        texts = model.encode_text(tokenizer(candidates)).numpy()
    cosine, softmax = clip_scores(texts, query)
    extra = {}
    bias = getattr(model, 'logit_bias', None)
    if bias is not None:  # SigLIP's own probability, as open_clip's get_logits computes its logits
        with torch.no_grad():
            logits = model.logit_scale.exp() * torch.from_numpy(cosine) + bias
        extra['siglip_score'] = torch.sigmoid(logits).detach().numpy()
    assert_rank_matches(ports, IMAGES[0], candidates, cosine, softmax, extra)
