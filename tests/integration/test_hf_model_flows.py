"""Each model family's shrunk folder (tests/model_folders.py: SigLIP, SigLIP2, MetaCLIP 2, XLM-R, CLIPA,
PE-Core, MobileCLIP2) served from local-dir by the shipped torch and onnx Flows, through clip-client, against
open_clip itself on the same folder (its model, its tokenizer, its preprocessing)."""

import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from clip_client import Client
from docarray import Document, DocumentArray
from PIL import Image

from ..model_folders import FAMILIES
from .conftest import flow_from_yaml, free_port, make_image, set_port

open_clip = pytest.importorskip('open_clip')
pytest.importorskip('transformers')
torch = pytest.importorskip('torch')

TEXTS = ['a photo of a cat', 'Café crème — à la carte!', '東京の夜景', ' '.join(['a long caption'] * 30)]


@pytest.fixture(scope='module', params=list(FAMILIES))
def served(request, family_folder, family_export, tmp_path_factory):
    folder = family_folder(request.param)
    name = f'local-dir:{folder}'
    exported, _ = family_export(request.param)
    ports = {'torch': free_port(), 'onnx': free_port()}
    flows = tmp_path_factory.mktemp('flows')
    torch_flow = flow_from_yaml('torch.yml', flows, lambda c: set_port(c, ports['torch']), {'CLIPSERVE_MODEL': name})
    onnx_flow = flow_from_yaml(
        'onnx.yml',
        flows,
        lambda c: set_port(c, ports['onnx']),
        {'CLIPSERVE_MODEL': name, 'CLIPSERVE_MODEL_PATH': str(exported)},
    )
    with ThreadPoolExecutor(2) as starting:  # both Flows start at once: their processes' imports overlap
        list(starting.map(lambda flow: flow.start(), (torch_flow, onnx_flow)))
    try:
        yield folder, ports
    finally:
        torch_flow.close()
        onnx_flow.close()


@pytest.fixture(scope='module')
def reference(served):
    folder, _ = served
    model, _, preprocess = open_clip.create_model_and_transforms(f'local-dir:{folder}')
    return model.eval(), preprocess, open_clip.get_tokenizer(f'local-dir:{folder}')


IMAGES = [make_image(300, 200, seed=1), make_image(90, 400, seed=2, fmt='JPEG')]


def test_both_flows_equal_open_clip_through_clip_client(served, reference):
    _, ports = served
    model, preprocess, tokenizer = reference
    with torch.no_grad():
        want_texts = model.encode_text(tokenizer(TEXTS)).numpy()
        pixels = torch.stack([preprocess(Image.open(io.BytesIO(data))) for data in IMAGES])
        want_images = model.encode_image(pixels).numpy()
    for backend, tolerance in (('torch', 1e-5), ('onnx', 1e-4)):
        client = Client(f'grpc://127.0.0.1:{ports[backend]}')
        texts = client.encode(TEXTS)
        images = client.encode(DocumentArray([Document(blob=data) for data in IMAGES])).embeddings
        text_diff, image_diff = np.abs(texts - want_texts).max(), np.abs(images - want_images).max()
        print(f'\n{backend} flow vs open_clip: texts {text_diff:.2e}, images {image_diff:.2e}')
        assert texts.shape == want_texts.shape and images.shape == want_images.shape
        assert text_diff <= tolerance and image_diff <= tolerance


def test_rank_keeps_clip_as_services_score_on_both_flows(served, reference):
    _, ports = served
    model, preprocess, tokenizer = reference
    candidates = ['a photo of a cat', 'a diagram', 'two dogs in the snow']
    with torch.no_grad():
        query = model.encode_image(preprocess(Image.open(io.BytesIO(IMAGES[0])))[None]).numpy()[0]
        texts = model.encode_text(tokenizer(candidates)).numpy()
    cosine = texts @ query / (np.linalg.norm(texts, axis=1) * np.linalg.norm(query))
    softmax = np.exp(100 * cosine - (100 * cosine).max())
    softmax /= softmax.sum()
    with torch.no_grad():  # SigLIP's own probability, as open_clip's get_logits computes its logits
        bias = getattr(model, 'logit_bias', None)
    sigmoid = (
        None
        if bias is None
        else torch.sigmoid(model.logit_scale.exp() * torch.from_numpy(cosine) + bias).detach().numpy()
    )
    for backend, tolerance in (('torch', 1e-4), ('onnx', 1e-3)):
        doc = Document(blob=IMAGES[0], matches=[Document(text=t) for t in candidates])
        ranked = Client(f'grpc://127.0.0.1:{ports[backend]}').rank(DocumentArray([doc]))[0].matches
        for match in ranked:
            i = candidates.index(match.text)
            assert abs(match.scores['clip_score'].value - softmax[i]) <= tolerance
            assert abs(match.scores['clip_score_cosine'].value - cosine[i]) <= tolerance
            if sigmoid is None:
                assert 'siglip_score' not in match.scores
            else:
                assert abs(match.scores['siglip_score'].value - sigmoid[i]) <= tolerance
        assert [m.text for m in ranked] == [candidates[i] for i in np.argsort(-softmax, kind='stable')]
