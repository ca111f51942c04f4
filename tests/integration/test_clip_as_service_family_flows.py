"""clip-as-service's M-CLIP and CN-CLIP models by their old names, served by the shipped torch and onnx Flows
and called through clip-client, against the reference packages (multilingual-clip, cn_clip) on the same
weights: M-CLIP's text tower shrunk (its config and weights written by multilingual-clip's own classes)
with ViT-B-32's image tower at random weights in the cache where a download would put them; CN-CLIP/RN50
(the smallest; cn_clip's configs are fixed) from a random checkpoint in cn_clip's published format."""

import functools
import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from clip_client import Client
from docarray import Document, DocumentArray
from PIL import Image

from ..model_folders import cache_open_clip_weights, cnclip_checkpoint, mclip_folder, mclip_reference
from .conftest import flow_from_yaml, free_port, make_image, set_port

torch = pytest.importorskip('torch')
open_clip = pytest.importorskip('open_clip')
transformers = pytest.importorskip('transformers')
cn_clip = pytest.importorskip('cn_clip.clip')

TEXTS = [
    'a photo of a cat',
    '一只猫的照片',
    'Café crème — à la carte!',
    '东京的夜景 🐶',
    ' '.join(['长长的标题 long caption'] * 40),
]
IMAGES = [make_image(300, 200, seed=1), make_image(90, 400, seed=2, fmt='JPEG')]


def _mclip(tmp, cache):
    folder = mclip_folder(tmp / 'mclip')
    weights = cache_open_clip_weights(cache, 'ViT-B-32', 'openai')
    model = mclip_reference(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    # OpenAI's weights were trained with QuickGELU, which open_clip applies for the `openai` tag (not for a file)
    image_model, _, preprocess = open_clip.create_model_and_transforms(
        'ViT-B-32', pretrained=str(weights), force_quick_gelu=True
    )
    image_model.eval()

    def encode_texts(texts):  # the package's forward, with clip-as-service's truncation to 77 tokens
        return model.forward(texts, functools.partial(tokenizer, max_length=77, truncation=True))

    def encode_images(images):
        return image_model.encode_image(torch.stack([preprocess(image) for image in images]))

    return f'M-CLIP/XLM-Roberta-Large-Vit-B-32::{folder}', encode_texts, encode_images


def _cnclip(tmp, cache):
    checkpoint = cnclip_checkpoint(tmp / 'clip_cn_rn50.pt', 'RN50@RBT3-chinese')
    model, preprocess = cn_clip.load_from_name(
        str(checkpoint), device='cpu', vision_model_name='RN50', text_model_name='RBT3-chinese', input_resolution=224
    )
    model.eval()

    def encode_texts(texts):
        return model.encode_text(cn_clip.tokenize(texts))

    def encode_images(images):
        return model.encode_image(torch.stack([preprocess(image) for image in images]))

    return f'CN-CLIP/RN50::{checkpoint}', encode_texts, encode_images


@pytest.fixture(scope='module', params=['M-CLIP', 'CN-CLIP'])
def served(request, tmp_path_factory):
    from clipserve.backends.onnx_export import export_onnx

    tmp = tmp_path_factory.mktemp(request.param)
    cache = tmp / 'cache'
    with pytest.MonkeyPatch.context() as env:
        env.setenv('CLIPSERVE_CACHE', str(cache))  # the image tower's weights; the Flows' processes inherit it
        env.setenv('HF_HUB_OFFLINE', '1')
        name, encode_texts, encode_images = (_mclip if request.param == 'M-CLIP' else _cnclip)(tmp, cache)
        exported = tmp / 'onnx'
        export_onnx(name, exported)
        ports = {'torch': free_port(), 'onnx': free_port()}
        flows = tmp / 'flows'
        flows.mkdir()
        torch_flow = flow_from_yaml(
            'torch.yml', flows, lambda c: set_port(c, ports['torch']), {'CLIPSERVE_MODEL': name}
        )
        onnx_flow = flow_from_yaml(
            'onnx.yml',
            flows,
            lambda c: set_port(c, ports['onnx']),
            {'CLIPSERVE_MODEL': name, 'CLIPSERVE_MODEL_PATH': str(exported)},
        )
        with ThreadPoolExecutor(2) as starting:  # both Flows start at once: their processes' imports overlap
            list(starting.map(lambda flow: flow.start(), (torch_flow, onnx_flow)))
        try:
            yield ports, encode_texts, encode_images
        finally:
            torch_flow.close()
            onnx_flow.close()


def _reference(encode_texts, encode_images):
    with torch.no_grad():
        texts = encode_texts(TEXTS).numpy()
        images = encode_images([Image.open(io.BytesIO(data)).convert('RGB') for data in IMAGES]).numpy()
    return texts, images


def test_both_flows_equal_the_reference_package_through_clip_client(served):
    ports, encode_texts, encode_images = served
    want_texts, want_images = _reference(encode_texts, encode_images)
    for backend, tolerance in (('torch', 1e-5), ('onnx', 1e-4)):
        client = Client(f'grpc://127.0.0.1:{ports[backend]}')
        texts = client.encode(TEXTS)
        images = client.encode(DocumentArray([Document(blob=data) for data in IMAGES])).embeddings
        text_diff, image_diff = np.abs(texts - want_texts).max(), np.abs(images - want_images).max()
        print(f'\n{backend} flow vs the reference: texts {text_diff:.2e}, images {image_diff:.2e}')
        assert texts.shape == want_texts.shape and images.shape == want_images.shape
        assert text_diff <= tolerance and image_diff <= tolerance


def test_rank_on_both_flows_scores_as_clip_as_service(served):
    ports, encode_texts, encode_images = served
    candidates = TEXTS[:4]
    with torch.no_grad():
        query = encode_images([Image.open(io.BytesIO(IMAGES[0])).convert('RGB')]).numpy()[0]
        texts = encode_texts(candidates).numpy()
    cosine = texts @ query / (np.linalg.norm(texts, axis=1) * np.linalg.norm(query))
    softmax = np.exp(100 * cosine - (100 * cosine).max())
    softmax /= softmax.sum()
    for backend, tolerance in (('torch', 1e-4), ('onnx', 1e-3)):
        doc = Document(blob=IMAGES[0], matches=[Document(text=t) for t in candidates])
        ranked = Client(f'grpc://127.0.0.1:{ports[backend]}').rank(DocumentArray([doc]))[0].matches
        for match in ranked:
            i = candidates.index(match.text)
            assert abs(match.scores['clip_score'].value - softmax[i]) <= tolerance
            assert abs(match.scores['clip_score_cosine'].value - cosine[i]) <= tolerance
            assert 'siglip_score' not in match.scores
        assert [m.text for m in ranked] == [candidates[i] for i in np.argsort(-softmax, kind='stable')]
