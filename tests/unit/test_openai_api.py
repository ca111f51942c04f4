"""The OpenAI-shaped request parsing, answers and errors on plain values (no Flow, no sockets); the routes
themselves run through real Flows with the openai SDK in tests/integration/test_openai_api.py."""

import array
import asyncio
import base64
import io
import json
import threading

import numpy as np
import pytest
from PIL import Image

from clipserve.errors import InvalidDocumentError
from clipserve.inputs.uris import UriError, UriPolicy
from clipserve.models.preprocess import PreprocessConfig, preprocess_bytes
from clipserve.serving.gateway import json_render
from clipserve.serving.gateway import openai_answers as answers
from clipserve.serving.gateway import openai_api as api
from clipserve.serving.gateway import openai_errors as v1_errors
from clipserve.serving.gateway.api_error import APIError


def png() -> bytes:
    buf = io.BytesIO()
    Image.new('RGB', (8, 8), (200, 10, 10)).save(buf, format='PNG')
    return buf.getvalue()


PNG = png()
DATA_URI = 'data:image/png;base64,' + base64.b64encode(PNG).decode()


def error_of(call) -> APIError:
    with pytest.raises(APIError) as caught:
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
    error = err.body()['error']
    assert set(error) - {'items'} == {'message', 'type', 'param', 'code'} and error['type'] == 'invalid_request_error'
    if '[' in param:  # an item by its position: named in `items` too, with the reason alone
        (item,) = error['items']
        assert item['param'] == param and item['index'] == int(param.split('[')[1].split(']')[0])
        assert words in item['message'] and not item['message'].startswith(param)


def test_every_bad_item_is_named_in_one_error_with_its_position():
    value = ['fine', '', {'image': 'data:image/png;base64,@@@'}, 'also fine', 7]
    err = error_of(lambda: api.parse_items(value))
    assert (err.status, err.param, err.code) == (400, 'input[1]', 'invalid_input')
    items = err.body()['error']['items']
    assert [(item['index'], item['param']) for item in items] == [
        (1, 'input[1]'),
        (2, 'input[2].image'),
        (4, 'input[4]'),
    ]
    assert [item['code'] for item in items] == ['invalid_value', 'invalid_image', 'unsupported_input']
    for item in items:  # the message still names each, for a person reading it
        assert f'{item["param"]}: {item["message"]}' in err.message
    # a size cap among them makes the whole a 413
    err = error_of(lambda: api.parse_items(['', DATA_URI], max_image_bytes=10))
    assert (err.status, err.code) == (413, 'too_large')
    assert [(item['index'], item['code']) for item in err.body()['error']['items']] == [
        (0, 'invalid_value'),
        (1, 'too_large'),
    ]


def test_the_encoders_failures_become_items_by_request_position():
    from clipserve.serving.gateway.openai_errors import failures_error

    params = {f'input-{i}': f'input[{i}]' for i in range(12)}
    err = failures_error([('input-3', 'not an image; or is it'), ('input-11', 'too large', 'too_large')], params)
    assert (err.status, err.param, err.code) == (413, 'input[3]', 'too_large')
    assert err.body()['error']['items'] == [
        {'index': 3, 'param': 'input[3]', 'message': 'not an image; or is it', 'code': 'invalid_input'},
        {'index': 11, 'param': 'input[11]', 'message': 'too large', 'code': 'too_large'},
    ]
    err = failures_error([('query', 'cannot read it')], {'query': 'query'})
    assert err.param == 'query' and 'items' not in err.body()['error']  # not an item with a position


def test_too_many_inputs_and_too_large_images():
    err = error_of(lambda: api.parse_items(['x'] * (api.MAX_INPUTS + 1)))
    assert err.status == 400 and str(api.MAX_INPUTS) in err.message and 'max_inputs' in err.message
    assert error_of(lambda: api.parse_items(['x'] * 4, max_items=3)).code == 'too_many_items'
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
        ({'input': 'a', 'return_multivector': 'yes'}, 'return_multivector'),
    ]:
        assert error_of(lambda: api.parse_embeddings_request(body)).param == param
    assert error_of(lambda: api.parse_embeddings_request(['a'])).code == 'invalid_json'


def test_dimensions_are_refused_unless_they_are_the_models_own():
    api.check_dimensions(None, 'm', 512)
    api.check_dimensions(512, 'm', 512)
    err = error_of(lambda: api.check_dimensions(256, 'ViT-B-32::openai', 512))
    assert (err.status, err.param) == (400, 'dimensions')
    assert 'not trained to be truncated' in err.message and '512' in err.message


def test_multivector_is_served_only_when_asked_and_only_by_late_interaction_models():
    assert api.parse_embeddings_request({'input': 'a', 'return_multivector': True}).return_multivector
    assert not api.parse_embeddings_request({'input': 'a'}).return_multivector
    api.check_multivector(False, 'ViT-B-32::openai', False)
    api.check_multivector(True, 'colqwen2', True)
    unasked = error_of(lambda: api.check_multivector(False, 'colqwen2', True))
    assert (unasked.status, unasked.param) == (400, 'return_multivector') and 'late-interaction' in unasked.message
    single = error_of(lambda: api.check_multivector(True, 'ViT-B-32::openai', False))
    assert (single.status, single.param) == (400, 'return_multivector') and 'one vector' in single.message
    answer = answers.multivector_response([np.ones((3, 2)), np.zeros((1, 2))], 'colqwen2', 'base64', 4)
    assert [row['shape'] for row in answer['data']] == [[3, 2], [1, 2]]
    assert answers.decode_base64(answer['data'][0]['embedding']).tolist() == [1.0] * 6


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
    encoded = answers.encode_base64(vector)
    # what openai-python does with a base64 embedding (with numpy, and without it)
    assert np.array_equal(np.frombuffer(base64.b64decode(encoded), dtype='float32'), vector)
    assert array.array('f', base64.b64decode(encoded)).tolist() == vector.tolist()
    assert np.array_equal(answers.decode_base64(encoded), vector)
    assert base64.b64decode(encoded)[:4] == vector[:1].astype('<f4').tobytes()


def test_embeddings_are_l2_normalised_and_answered_in_openais_shape():
    raw = np.array([[3.0, 4.0], [0.0, 0.0], [1e-20, 0.0]], dtype=np.float32)
    unit = answers.l2_normalise(raw)
    assert unit.dtype == np.float32
    np.testing.assert_allclose(unit, [[0.6, 0.8], [0, 0], [1, 0]], atol=1e-7)
    answer = answers.embeddings_response(unit, 'm', 'float', 7)
    assert answer['object'] == 'list' and answer['model'] == 'm'
    assert answer['usage'] == {'prompt_tokens': 7, 'total_tokens': 7}
    assert [d['index'] for d in answer['data']] == [0, 1, 2] and answer['data'][0]['object'] == 'embedding'
    rendered = json.loads(json_render.render(answer))  # what a client reads
    assert rendered['data'][0]['embedding'] == [0.6, 0.8] and rendered['data'][1]['embedding'] == [0, 0]
    assert np.array_equal(np.array([d['embedding'] for d in rendered['data']], dtype=np.float32), unit)
    b64 = answers.embeddings_response(unit, 'm', 'base64', 0)
    assert np.array_equal(answers.decode_base64(b64['data'][2]['embedding']), unit[2])


def test_embeddings_render_in_their_shortest_float32_form_and_read_back_exactly():
    vectors = answers.l2_normalise(np.random.default_rng(1).normal(size=(4, 512)))
    answer = answers.embeddings_response(vectors, 'm', 'float', 0)
    rendered = json_render.render(answer)
    read = np.array([row['embedding'] for row in json.loads(rendered)['data']], dtype=np.float32)
    assert np.array_equal(read, vectors)  # the encoder's float32 values, bit for bit
    as_float64 = json.dumps(
        {**answer, 'data': [{**row, 'embedding': row['embedding'].tolist()} for row in answer['data']]}
    )
    assert len(rendered) < 0.7 * len(as_float64)  # not the float64 digits of the same values
    nested = json.loads(json_render.render(answers.multivector_response([np.ones((3, 2))], 'colqwen2', 'float', 0)))
    assert nested['data'][0]['embedding'] == [[1, 1]] * 3 and nested['data'][0]['shape'] == [3, 2]
    assert json.loads(json_render.render({'score': float('nan'), 'x': np.float32(0.5)})) == {'score': None, 'x': 0.5}


def test_answers_with_many_numbers_render_on_a_thread_small_ones_on_the_event_loop(monkeypatch):
    threads = []
    render = json_render.render
    monkeypatch.setattr(json_render, 'render', lambda payload: threads.append(threading.get_ident()) or render(payload))
    small = answers.embeddings_response(np.ones((2, 8)), 'm', 'float', 0)
    large = answers.embeddings_response(np.ones((2, json_render.INLINE_NUMBERS)), 'm', 'float', 0)
    assert json_render.numbers_in(small) == 16 and json_render.numbers_in(large) == 2 * json_render.INLINE_NUMBERS
    assert json_render.numbers_in(answers.embeddings_response(np.ones((2, 8)), 'm', 'base64', 0)) == 0

    async def both():
        return await json_render.rendered(small), await json_render.rendered(large), threading.get_ident()

    small_json, large_json, loop_thread = asyncio.run(both())
    assert threads[0] == loop_thread and threads[1] != loop_thread
    assert json.loads(small_json)['data'][1]['embedding'] == [1] * 8 and len(json.loads(large_json)['data']) == 2


def test_rank_and_models_answers():
    results = [
        answers.RankResult(2, 0.7, 0.3),
        answers.RankResult(0, 0.2, 0.25, siglip_score=0.1),
        answers.RankResult(1, 0.1, 0.2),
    ]
    answer = answers.rank_response(results, 'm', 5, top_n=2)
    assert [r['index'] for r in answer['results']] == [2, 0]
    assert answer['results'][0] == {'index': 2, 'relevance_score': 0.7, 'clip_score': 0.7, 'clip_score_cosine': 0.3}
    assert answer['results'][1]['siglip_score'] == 0.1 and answer['usage']['total_tokens'] == 5
    assert len(answers.rank_response(results, 'm', 0)['results']) == 3
    models = answers.models_response([answers.ServedModel('a::b', 64, ('A',), True)], created=5)
    assert models == {
        'object': 'list',
        'capabilities': {'search': False, 'rerankers': []},
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
                'multi_vector': False,
            }
        ],
    }
    searching = answers.models_response([], created=5, search=True, rerankers=('r',))
    assert searching['capabilities'] == {'search': True, 'rerankers': ['r']}


# ---- the encoder's failures ---------------------------------------------------------------------


def _reason(call) -> str:
    try:
        call()
    except (UriError, ValueError) as e:
        return str(e)
    raise AssertionError('no error')


def test_the_size_caps_messages_are_413s_other_bad_images_400s():
    """The classifier reads the messages of uris.py, engine/image_inputs.py and preprocess.py: pinned here."""
    from clipserve.engine.image_inputs import capped

    config = PreprocessConfig(image_size=32, max_pixels=10)
    too_large = [
        _reason(lambda: UriPolicy(max_bytes=4).load(DATA_URI)),
        _reason(lambda: capped(b'x' * 10, 4)),
        _reason(lambda: preprocess_bytes(PNG, config)),
    ]
    assert all(v1_errors.is_size_limit(r) for r in too_large), too_large
    bad = [_reason(lambda: preprocess_bytes(b'not an image', PreprocessConfig(image_size=32))), 'empty image data']
    assert not any(v1_errors.is_size_limit(r) for r in bad), bad


def test_invalid_documents_map_back_to_the_requests_items_from_the_errors_details():
    from clipserve.errors import details_of

    failures = [('input-3', 'not an image Pillow can decode'), ('input-0', "odd; reason: 'quoted'")]
    carried = details_of(InvalidDocumentError(failures).args)['failures']  # as Jina relays the arguments
    err = v1_errors.failures_error(carried, {'input-3': 'input[3]', 'input-0': 'input[0]'})
    assert (err.status, err.param, err.code) == (400, 'input[3]', 'invalid_input')
    assert err.message == "input[3]: not an image Pillow can decode; input[0]: odd; reason: 'quoted'"
    # a failure that names its kind is classed by it, whatever its words
    assert v1_errors.failures_error([['input-1', 'too big', 'payload_too_large']], {}).status == 413
    assert (
        v1_errors.failures_error([['input-1', 'larger than the limit of 10 bytes', 'invalid_document']], {}).status
        == 400
    )
    # without a kind (today's encoder), by the size caps' messages
    big = details_of(InvalidDocumentError([('input-1', 'the data: URI is larger than the limit of 10 bytes')]).args)
    assert v1_errors.failures_error(big['failures'], {'input-1': 'input[1]'}).status == 413
    many = details_of(InvalidDocumentError([(f'input-{i}', 'bad') for i in range(25)]).args)
    assert len(many['failures']) == 25


# ---- the body -----------------------------------------------------------------------------------


def test_json_bodies_with_more_values_than_the_inputs_allow_are_refused_before_they_are_built():
    import json

    most = 8 * api.MAX_INPUTS + 64
    for item in (b'{},', b'"",', b'[],', b'0,'):
        raw = b'{"input": [' + item * (most + 1) + b'1]}'
        assert api.too_many_values(raw, most), item
        err = error_of(lambda: api.parse_body(raw))
        assert (err.status, err.code) == (400, 'too_many_items') and 'max_inputs' in err.message
    legit = [
        {'input': ['a, b, [c], {d}' * 200] * api.MAX_INPUTS},  # commas and brackets inside texts are not values
        {'input': [{'type': 'image_url', 'image_url': {'url': DATA_URI}}] * api.MAX_INPUTS},
        {'input': ['say \\"hi\\", [x]' * 100] * 100},
    ]
    for body in legit:
        raw = json.dumps(body).encode()
        assert not api.too_many_values(raw, most)
        assert api.parse_body(raw) == body
    assert error_of(lambda: api.parse_body(b'{"input": ')).code == 'invalid_json'
    assert error_of(lambda: api.parse_body(b'[' * 5_000)).code == 'invalid_json'  # nested too deeply
