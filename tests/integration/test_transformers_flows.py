"""transformers checkpoints of each model type (shrunk, devkit/model_folders.py) served as
`transformers:/folder` by the shipped torch and onnx Flows, through clip-client, against transformers' own
model, tokenizer and PIL image processor on the same folder (SigLIP2: NaFlex patches, images of several
aspect ratios in one request); /rank's scores, with siglip_score for the sigmoid-trained types."""

import io

import pytest
from clip_client import Client
from PIL import Image

from ..compare import assert_close
from ..transformers_folders import TRANSFORMERS_TYPES, transformers_checkpoint
from .conftest import make_image
from .served_pair import assert_encodings_match, assert_rank_matches, clip_scores, torch_and_onnx_flows

torch = pytest.importorskip('torch')
t = pytest.importorskip('transformers')

TEXTS = ['a photo of a cat', 'Café crème — à la carte!', '東京の夜景', ' '.join(['a long caption'] * 40)]
IMAGES = [make_image(300, 200, seed=1), make_image(90, 401, seed=2, fmt='JPEG'), make_image(7, 5, seed=3)]
PIL_PROCESSORS = {
    'siglip': 'SiglipImageProcessorPil',
    'siglip2': 'Siglip2ImageProcessorPil',
    'chinese_clip': 'ChineseCLIPImageProcessorPil',
}
CONTEXTS = {'siglip': 16, 'siglip2': 64, 'chinese_clip': 52, 'altclip': 78}
SIGMOID = ('siglip', 'siglip2')


@pytest.fixture(scope='module', params=TRANSFORMERS_TYPES)
def served(request, tmp_path_factory):
    from clipserve.backends.onnx.export import export_onnx

    tmp = tmp_path_factory.mktemp(request.param)
    folder = transformers_checkpoint(tmp / request.param, request.param)
    name = f'transformers:{folder}'
    exported = tmp / 'onnx'
    export_onnx(name, exported)
    with torch_and_onnx_flows(name, exported, tmp / 'flows') as ports:
        yield request.param, folder, ports


def _model(folder):
    return t.AutoModel.from_pretrained(str(folder)).eval()


def _reference(kind, folder, texts, images):
    model = _model(folder)
    tokenizer = t.AutoTokenizer.from_pretrained(str(folder))
    processor = getattr(t, PIL_PROCESSORS.get(kind, 'CLIPImageProcessorPil')).from_pretrained(str(folder))
    padding = 'max_length' if kind in SIGMOID else True
    context = CONTEXTS.get(kind, 77)
    tokens = tokenizer(texts, padding=padding, truncation=True, max_length=context, return_tensors='pt')
    inputs = processor([Image.open(io.BytesIO(b)) for b in images], return_tensors='pt')
    with torch.no_grad():
        return (
            model.get_text_features(**tokens).pooler_output.numpy(),
            model.get_image_features(**inputs).pooler_output.numpy(),
        )


def test_both_flows_equal_transformers_through_clip_client(served):
    kind, folder, ports = served
    want_texts, want_images = _reference(kind, folder, TEXTS, IMAGES)
    assert_encodings_match(ports, kind, TEXTS, IMAGES, want_texts, want_images)


def test_rank_scores_as_clip_as_service_on_both_flows(served):
    kind, folder, ports = served
    candidates = TEXTS[:3]
    texts, images = _reference(kind, folder, candidates, IMAGES[:1])
    cosine, softmax = clip_scores(texts, images[0])
    extra = {}
    if kind in SIGMOID:  # the model's own probability of each pair: sigmoid(exp(scale) x cosine + bias)
        model = _model(folder)
        logits = torch.from_numpy(cosine) * model.logit_scale.exp() + model.logit_bias
        extra['siglip_score'] = torch.sigmoid(logits).detach().numpy()
    assert_rank_matches(ports, IMAGES[0], candidates, cosine, softmax, extra)


def test_remote_code_serves_through_a_flow_only_with_the_executor_opt_in(tmp_path):
    """The executor arguments reach the model: refused without trust_remote_code (the executor does not
    start), served with it, truncated to a trained Matryoshka size."""
    from jina import Flow

    from clipserve import CLIPEncoder
    from clipserve.backends import BackendOptions, create_backend
    from clipserve.errors import UnknownModelError

    from ..transformers_folders import remote_code_checkpoint

    name = f'transformers:{remote_code_checkpoint(tmp_path / "remote")}'
    with pytest.raises(UnknownModelError, match='trust_remote_code: true'):
        CLIPEncoder(name=name)
    texts = ['a photo of a cat', 'two dogs in the snow']
    reference = create_backend('torch', name, BackendOptions(device='cpu', trust_remote_code=True, truncate_dim=16))
    tokens = reference.tokenizer(texts)
    want = reference.encode_texts(tokens.input_ids, tokens.attention_mask)
    flow = Flow().add(uses=CLIPEncoder, uses_with={'name': name, 'trust_remote_code': True, 'truncate_dim': 16})
    with flow:
        got = Client(f'grpc://127.0.0.1:{flow.port}').encode(texts)
    assert got.shape == (2, 16)
    assert_close(got, want, rel=1e-6)
