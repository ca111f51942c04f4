"""The OpenAI-shaped request parsing, answers and errors on plain values (no Flow, no sockets); the routes
themselves run through real Flows with the openai SDK in tests/integration/test_openai_api.py."""

import array
import base64
import io

import numpy as np
import pytest
from PIL import Image

from clipserve import openai_api as api
from clipserve.errors import InvalidDocumentError
from clipserve.models.preprocess import PreprocessConfig, preprocess_bytes
from clipserve.uris import UriError, UriPolicy


def png() -> bytes:
    buf = io.BytesIO()
    Image.new('RGB', (8, 8), (200, 10, 10)).save(buf, format='PNG')
    return buf.getvalue()


PNG = png()
DATA_URI = 'data:image/png;base64,' + base64.b64encode(PNG).decode()


def error_of(call) -> api.APIError:
    with pytest.raises(api.APIError) as caught:
        call()
    return caught.value


# ---- inputs -------------------------------------------------------------------------------------


def test_strings_are_texts_unless_they_are_an_image_data_uri_or_an_http_url():
    items = api.parse_items(['a dog', DATA_URI, 'https://example.com/cat.jpg', 'HTTP://x.org/a', 'data:text/plain,hi'])
    assert [i.modality for i in items] == ['text', 'image', 'image', 'image', 'text']
    assert items[0].text == 'a dog' and items[1].image == PNG and items[2].url == 'https://example.com/cat.jpg'
    assert items[4].text == 'data:text/plain,hi'
    assert api.parse_items('just one') == [api.Item('text', text='just one')]


def test_item_objects_in_each_shape_say_what_they_are():
    b64 = base64.b64encode(PNG).decode()
    items = api.parse_items(
        [
            {'text': 'https://example.com/not-fetched'},
            {'image': DATA_URI},
            {'image': b64},  # bare base64: only where the item says it is an image
            {'image': 'https://example.com/a.png'},
            {'type': 'text', 'text': 'a cat'},
            {'type': 'image_url', 'image_url': {'url': DATA_URI}},
            {'type': 'image_url', 'image_url': 'https://example.com/b.png'},
        ]
    )
    assert [i.modality for i in items] == ['text', 'image', 'image', 'image', 'text', 'image', 'image']
    assert items[0].text == 'https://example.com/not-fetched'
    assert items[1].image == items[2].image == items[5].image == PNG
    assert items[3].url.endswith('a.png') and items[6].url.endswith('b.png')


def test_infinitys_modality_decides_for_every_string():
    assert [i.modality for i in api.parse_items(['https://x.org/a.png', DATA_URI], modality='text')] == ['text'] * 2
    b64 = base64.b64encode(PNG).decode()
    assert [i.image for i in api.parse_items([DATA_URI, b64], modality='image')] == [PNG, PNG]
    err = error_of(lambda: api.parse_items(['a dog'], modality='image'))
    assert err.status == 400 and err.param == 'input[0]' and 'not an image' in err.message
    err = error_of(lambda: api.parse_embeddings_request({'input': 'x', 'modality': 'audio'}))
    assert err.status == 400 and err.param == 'modality'


@pytest.mark.parametrize(
    'value, param, words',
    [
        (['fine', ''], 'input[1]', 'empty text'),
        (['fine', '   '], 'input[1]', 'empty text'),
        ([], 'input', 'empty list'),
        (None, 'input', 'required'),
        ([1, 2, 3], 'input', 'token id arrays are not supported'),
        (['ok', [1, 2]], 'input[1]', 'token id arrays are not supported'),
        (['ok', 3.5], 'input[1]', 'got float'),
        ([{'text': 'a', 'image': DATA_URI}], 'input[0]', 'exactly one of'),
        ([{}], 'input[0]', 'exactly one of'),
        ([{'text': 5}], 'input[0].text', 'must be a string'),
        ([{'image': 'not base64 at all!'}], 'input[0].image', 'not an image'),
        ([{'image': 'data:image/png;base64,@@@'}], 'input[0].image', 'malformed base64'),
        (['data:image/png;base64,'], 'input[0]', 'empty image'),
        ([{'type': 'video', 'video': 'x'}], 'input[0]', "type 'video'"),
    ],
)
def test_bad_inputs_are_400s_naming_the_item(value, param, words):
    err = error_of(lambda: api.parse_items(value))
    assert (err.status, err.param) == (400, param)
    assert words in err.message and err.message.startswith((param, f"'{param}'"))
    assert set(err.body()['error']) == {'message', 'type', 'param', 'code'}
    assert err.body()['error']['type'] == 'invalid_request_error'


def test_too_many_inputs_and_too_large_images():
    err = error_of(lambda: api.parse_items(['x'] * (api.MAX_INPUTS + 1)))
    assert err.status == 400 and str(api.MAX_INPUTS) in err.message
    err = error_of(lambda: api.parse_items(['ok', DATA_URI], max_image_bytes=10))
    assert (err.status, err.param, err.code) == (
        413,
        'input[1]',
        'too_large',
    ) and 'larger than the limit' in err.message
    err = error_of(lambda: api.parse_items([{'image': base64.b64encode(PNG).decode()}], max_image_bytes=10))
    assert (err.status, err.param) == (413, 'input[0].image')


def test_the_embeddings_request_fields():
    request = api.parse_embeddings_request(
        {'input': ['a'], 'model': ' m ', 'encoding_format': 'base64', 'user': 'someone', 'extra': 1}
    )
    assert (request.model, request.encoding_format, request.dimensions) == ('m', 'base64', None)
    assert api.parse_embeddings_request({'input': 'a'}).model is None  # the Flow's default model
    for body, param in [
        ({'input': 'a', 'encoding_format': 'binary'}, 'encoding_format'),
        ({'input': 'a', 'dimensions': '8'}, 'dimensions'),
        ({'input': 'a', 'model': 5}, 'model'),
    ]:
        assert error_of(lambda: api.parse_embeddings_request(body)).param == param
    assert error_of(lambda: api.parse_embeddings_request(['a'])).code == 'invalid_json'


def test_dimensions_are_refused_unless_they_are_the_models_own():
    api.check_dimensions(None, 'm', 512)
    api.check_dimensions(512, 'm', 512)
    err = error_of(lambda: api.check_dimensions(256, 'ViT-B-32::openai', 512))
    assert (err.status, err.param) == (400, 'dimensions')
    assert 'not trained to be truncated' in err.message and '512' in err.message


def test_the_rank_request():
    request = api.parse_rank_request({'query': DATA_URI, 'documents': ['a dog', {'text': 'a cat'}], 'top_n': 1})
    assert request.query.modality == 'image' and [d.text for d in request.documents] == ['a dog', 'a cat']
    assert request.top_n == 1
    assert len(api.parse_rank_request({'query': 'q', 'candidates': ['a']}).documents) == 1
    assert error_of(lambda: api.parse_rank_request({'documents': ['a']})).param == 'query'
    assert error_of(lambda: api.parse_rank_request({'query': ['a'], 'documents': ['a']})).param == 'query'
    assert error_of(lambda: api.parse_rank_request({'query': 'q', 'documents': 'a'})).param == 'documents'
    assert error_of(lambda: api.parse_rank_request({'query': 'q', 'documents': ['a', '']})).param == 'documents[1]'
    assert error_of(lambda: api.parse_rank_request({'query': 'q', 'candidates': ['']})).param == 'candidates[0]'
    assert error_of(lambda: api.parse_rank_request({'query': 'q', 'documents': ['a'], 'top_n': 0})).param == 'top_n'


# ---- answers ------------------------------------------------------------------------------------


def test_base64_is_little_endian_float32_exactly_as_the_openai_sdk_decodes_it():
    vector = np.random.default_rng(0).normal(size=17).astype(np.float32)
    encoded = api.encode_base64(vector)
    # what openai-python does with a base64 embedding (with numpy, and without it)
    assert np.array_equal(np.frombuffer(base64.b64decode(encoded), dtype='float32'), vector)
    assert array.array('f', base64.b64decode(encoded)).tolist() == vector.tolist()
    assert np.array_equal(api.decode_base64(encoded), vector)
    assert base64.b64decode(encoded)[:4] == vector[:1].astype('<f4').tobytes()


def test_embeddings_are_l2_normalised_and_answered_in_openais_shape():
    raw = np.array([[3.0, 4.0], [0.0, 0.0], [1e-20, 0.0]], dtype=np.float32)
    unit = api.l2_normalise(raw)
    assert unit.dtype == np.float32
    np.testing.assert_allclose(unit, [[0.6, 0.8], [0, 0], [1, 0]], atol=1e-7)
    answer = api.embeddings_response(unit, 'm', 'float', 7)
    assert answer['object'] == 'list' and answer['model'] == 'm'
    assert answer['usage'] == {'prompt_tokens': 7, 'total_tokens': 7}
    assert [d['index'] for d in answer['data']] == [0, 1, 2] and answer['data'][0]['object'] == 'embedding'
    assert answer['data'][0]['embedding'] == unit[0].tolist()
    b64 = api.embeddings_response(unit, 'm', 'base64', 0)
    assert np.array_equal(api.decode_base64(b64['data'][2]['embedding']), unit[2])


def test_rank_and_models_answers():
    results = [api.RankResult(2, 0.7, 0.3), api.RankResult(0, 0.2, 0.25, siglip_score=0.1), api.RankResult(1, 0.1, 0.2)]
    answer = api.rank_response(results, 'm', 5, top_n=2)
    assert [r['index'] for r in answer['results']] == [2, 0]
    assert answer['results'][0] == {'index': 2, 'relevance_score': 0.7, 'clip_score': 0.7, 'clip_score_cosine': 0.3}
    assert answer['results'][1]['siglip_score'] == 0.1 and answer['usage']['total_tokens'] == 5
    assert len(api.rank_response(results, 'm', 0)['results']) == 3
    models = api.models_response([api.ServedModel('a::b', 64, ('A',), True)], created=5)
    assert models == {
        'object': 'list',
        'data': [
            {
                'id': 'a::b',
                'object': 'model',
                'created': 5,
                'owned_by': 'clipserve',
                'embedding_dimensions': 64,
                'modalities': ['text', 'image'],
                'aliases': ['A'],
                'default': True,
            }
        ],
    }


# ---- the encoder's failures ---------------------------------------------------------------------


def _reason(call) -> str:
    try:
        call()
    except (UriError, ValueError) as e:
        return str(e)
    raise AssertionError('no error')


def test_the_size_caps_messages_are_413s_other_bad_images_400s():
    """The classifier reads the messages of uris.py, documents.py and preprocess.py: pinned here."""
    from clipserve.documents import _capped

    config = PreprocessConfig(image_size=32, max_pixels=10)
    too_large = [
        _reason(lambda: UriPolicy(max_bytes=4).load(DATA_URI)),
        _reason(lambda: _capped(b'x' * 10, 4)),
        _reason(lambda: preprocess_bytes(PNG, config)),
    ]
    assert all(api.is_size_limit(r) for r in too_large), too_large
    bad = [_reason(lambda: preprocess_bytes(b'not an image', PreprocessConfig(image_size=32))), 'empty image data']
    assert not any(api.is_size_limit(r) for r in bad), bad


def test_invalid_document_messages_map_back_to_the_requests_items():
    failures = [('input-3', 'not an image Pillow can decode'), ('input-0', "odd; reason: 'quoted'")]
    message = str(InvalidDocumentError(failures))
    assert api.parse_failures(message) == failures
    err = api.failures_error(api.parse_failures(message), {'input-3': 'input[3]', 'input-0': 'input[0]'})
    assert (err.status, err.param) == (400, 'input[3]')
    assert err.message == "input[3]: not an image Pillow can decode; input[0]: odd; reason: 'quoted'"
    big = str(InvalidDocumentError([('input-1', 'the data: URI is larger than the limit of 10 bytes')]))
    assert api.failures_error(api.parse_failures(big), {'input-1': 'input[1]'}).status == 413
    many = str(InvalidDocumentError([(f'input-{i}', 'bad') for i in range(25)]))
    assert len(api.parse_failures(many)) == 20
