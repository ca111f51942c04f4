"""`from clipserve import Model`: the engine in this process (engine/model.py), on the tiny model's real
architecture. Its vectors against a served Flow's: tests/integration/test_model_api_flow.py."""

from __future__ import annotations

import base64
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from clipserve import Model
from clipserve.engine import ranking
from clipserve.engine.model import ImagesFailedError
from clipserve.errors import InvalidParameterError, UnknownModelError

from ..compare import assert_close, assert_cosine
from ..conftest import TINY

ROOT = Path(__file__).resolve().parents[2]
DOG, CAR = ROOT / 'examples' / 'dog.jpg', ROOT / 'examples' / 'car.jpg'


def png(seed: int, size=(40, 30)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format='PNG')
    return out.getvalue()


@pytest.fixture(scope='module')
def model():
    with Model(TINY, batch_size=4, dtype='fp32') as loaded:
        yield loaded


def test_importing_and_embedding_pulls_in_neither_jina_nor_docarray():
    code = (
        'import sys; from clipserve import Model; '
        f'm = Model({TINY!r}); v = m.embed_texts(["a dog"]); m.close(); '
        'print(v.shape, sorted(n for n in ("jina", "docarray") if n in sys.modules))'
    )
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-3:] == ['(1,', '64)', '[]'], result.stdout


def test_texts_come_back_in_order_unit_length_and_as_the_pipeline_gives_them(model):
    texts = ['a photo of a dog', 'hi', 'a much longer caption about a red car parked on a street at night']
    unit = model.embed_texts(texts)
    raw = model.embed_texts(texts, normalize=False)
    assert unit.shape == (3, model.embed_dim) and unit.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, rtol=1e-6)
    assert_close(unit, raw / np.linalg.norm(raw, axis=1, keepdims=True))
    assert_close(
        model.embed_texts(texts[1:2]), unit[1:2]
    )  # alone as in a batch (fp32: the tests set CLIPSERVE_CPU_BF16=0)
    assert model.embed_texts([]).shape == (0, model.embed_dim)


def test_every_form_of_one_picture_gives_the_same_vector(model):
    data = DOG.read_bytes()
    uri = 'data:image/jpeg;base64,' + base64.b64encode(data).decode()
    forms = [str(DOG), DOG, data, bytearray(data), uri, f'file://{DOG}']
    got = model.embed_images(forms)
    assert_close(got, np.repeat(got[:1], len(forms), axis=0), rel=1e-6)
    with Image.open(DOG) as picture:  # decoded by the caller: the same pixels as the file's
        assert_close(model.embed_images([picture]), got[:1], rel=1e-6)
        array = np.asarray(picture.convert('RGB'))
    assert_close(model.embed_images([array]), got[:1], rel=1e-6)
    assert not np.allclose(model.embed_images([CAR])[0], got[0])


def test_bad_images_are_named_and_the_good_ones_kept(model):
    good = [png(1), png(2)]
    images = [good[0], b'not an image', '/no/such/file.png', good[1], np.zeros((0, 3, 3), np.uint8)]
    with pytest.raises(ImagesFailedError) as caught:
        model.embed_images(images)
    error = caught.value
    assert sorted(error.failures_by_index) == [1, 2, 4]
    message = str(error)
    assert 'images[1]' in message and 'not an image' in message
    assert 'images[2]' in message and 'images[4]' in message and 'images[0]' not in message
    assert np.isnan(error.embeddings[[1, 2, 4]]).all()
    assert_close(error.embeddings[[0, 3]], model.embed_images(good))  # nothing lost
    assert model.embed_images([png(3)]).shape == (1, model.embed_dim)  # and the model keeps working


def test_wrong_types_are_refused_by_position(model):
    with pytest.raises(InvalidParameterError, match=r'texts\[1\] is a int'):
        model.embed_texts(['a dog', 7])
    with pytest.raises(InvalidParameterError, match=r'images\[0\] is a int'):
        model.embed_images([3])
    with pytest.raises(InvalidParameterError, match='one query'):
        model.rank(text='a dog', image=png(0), images=[png(1)])
    with pytest.raises(InvalidParameterError, match='chunk'):
        next(model.iter_texts(['a'], chunk=0))


def test_urls_are_fetched_only_when_allowed_and_never_from_private_addresses(model):
    with pytest.raises(ImagesFailedError, match='fetching remote URIs is disabled'):
        model.embed_images(['http://127.0.0.1:9/x.png'])
    with Model(TINY, allow_remote=True) as remote:
        # no batch_size given: torch on a CPU takes its larger text passes
        assert remote.pipeline.minibatch_size == remote.backend.cpu_text_batch == 256
        for url in (
            'http://127.0.0.1:9/x.png',
            'http://[::1]:9/x.png',
            'http://10.0.0.1/x.png',
            'http://localhost:9/x',
        ):
            with pytest.raises(ImagesFailedError) as caught:
                remote.embed_images([url])
            assert 'images[0]' in str(caught.value) and 'non-public address' in str(caught.value), url


def test_rank_is_clip_as_services_rank(model):
    images = [png(10), png(11), png(12)]
    ranked = model.rank(text='a photo of a dog', images=images)
    query, candidates = model.embed_texts(['a photo of a dog'])[0], model.embed_images(images)
    scores, cosines = ranking.clip_scores(query, candidates)
    assert [r.index for r in ranked] == list(ranking.descending_order(scores))
    assert [r.score for r in ranked] == pytest.approx(sorted(scores, reverse=True), rel=1e-9)
    assert sum(r.score for r in ranked) == pytest.approx(1.0)
    assert {r.index: r.cosine for r in ranked} == pytest.approx(dict(enumerate(cosines)))
    by_image = model.rank(image=images[0], texts=['a dog', 'a car'])
    assert sorted(r.index for r in by_image) == [0, 1] and by_image[0].score >= by_image[1].score
    assert model.rank(text='a dog', texts=[]) == []


def test_iterators_read_their_input_lazily_and_match_one_call(model):
    read = []

    def texts():
        for i in range(10):
            read.append(i)
            yield f'caption number {i}'

    chunks = model.iter_texts(texts(), chunk=4)
    first = next(chunks)
    assert first.shape == (4, model.embed_dim) and len(read) <= 5  # one chunk (and the look-ahead) read
    rest = list(chunks)
    assert [len(c) for c in rest] == [4, 2]
    assert_close(np.concatenate([first, *rest]), model.embed_texts([f'caption number {i}' for i in range(10)]))
    images = [png(i) for i in range(5)]
    assert_close(np.concatenate(list(model.iter_images(images, chunk=2))), model.embed_images(images))


def test_unknown_models_and_bad_settings_fail_before_anything_loads():
    with pytest.raises(UnknownModelError):
        Model('ViT-Nope-99::openai')
    with pytest.raises(InvalidParameterError, match='batch_size'):
        Model(TINY, batch_size=0)


def test_onnx_backend_gives_the_torch_vectors(tiny_onnx_export, model):
    texts, images = ['a dog on a beach', 'a red car'], [png(20), png(21)]
    with Model(TINY, backend='onnx', model_path=str(tiny_onnx_export), dtype='fp32') as onnx:
        assert onnx.pipeline.minibatch_size == 32  # onnxruntime runs batches of 32 texts best
        assert_cosine(onnx.embed_texts(texts), model.embed_texts(texts), 0.99999)
        assert_cosine(onnx.embed_images(images), model.embed_images(images), 0.99999)
