"""clip-as-service's M-CLIP and CN-CLIP models by their old names, served by the shipped torch and onnx Flows
and called through clip-client, against the reference packages (multilingual-clip, cn_clip) on the same
weights: M-CLIP's text tower shrunk (its config and weights written by multilingual-clip's own classes)
with ViT-B-32's image tower at random weights in the cache where a download would put them; CN-CLIP/RN50
(the smallest; cn_clip's configs are fixed) from a random checkpoint in cn_clip's published format."""

import functools
import io

import pytest
from PIL import Image

from devkit.model_folders import cache_open_clip_weights, cnclip_checkpoint, mclip_folder, mclip_reference

from .conftest import make_image
from .served_pair import assert_encodings_match, assert_rank_matches, clip_scores, torch_and_onnx_flows

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
    from clipserve.backends.onnx.export import export_onnx

    tmp = tmp_path_factory.mktemp(request.param)
    cache = tmp / 'cache'
    with pytest.MonkeyPatch.context() as env:
        env.setenv('CLIPSERVE_CACHE', str(cache))  # the image tower's weights; the Flows' processes inherit it
        env.setenv('HF_HUB_OFFLINE', '1')
        name, encode_texts, encode_images = (_mclip if request.param == 'M-CLIP' else _cnclip)(tmp, cache)
        exported = tmp / 'onnx'
        export_onnx(name, exported)
        with torch_and_onnx_flows(name, exported, tmp / 'flows') as ports:
            yield ports, encode_texts, encode_images


def _reference(encode_texts, encode_images):
    with torch.no_grad():
        texts = encode_texts(TEXTS).numpy()
        images = encode_images([Image.open(io.BytesIO(data)).convert('RGB') for data in IMAGES]).numpy()
    return texts, images


def test_both_flows_equal_the_reference_package_through_clip_client(served):
    ports, encode_texts, encode_images = served
    want_texts, want_images = _reference(encode_texts, encode_images)
    assert_encodings_match(ports, 'clip-as-service family', TEXTS, IMAGES, want_texts, want_images)


def test_rank_on_both_flows_scores_as_clip_as_service(served):
    ports, encode_texts, encode_images = served
    candidates = TEXTS[:4]
    with torch.no_grad():
        query = encode_images([Image.open(io.BytesIO(IMAGES[0])).convert('RGB')]).numpy()[0]
        texts = encode_texts(candidates).numpy()
    assert_rank_matches(ports, IMAGES[0], candidates, *clip_scores(texts, query))
