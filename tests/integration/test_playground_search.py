"""The playground's search tab in headless chromium (browser.py) against flows/search-rerank.yml: the tiny CLIP
model at random weights, an embedded Qdrant index and a tiny random-weights cross-encoder, as a user drives it.

Captioned images (a data URI and its caption, the caption embedded) and images alone are indexed with the
unchanged clip-client; a typed caption finds its own image first, shown as a picture with its score and caption;
a picked image file finds itself; the rerank option and a tag filter give what /v1/search gives for the same
body; a filter that is not JSON, or that the server refuses, is shown, and the next search works. Every request
the page makes goes to the gateway."""

from __future__ import annotations

import json
import os

import pytest
import requests
import yaml

from ..transformers_folders import cross_encoder_checkpoint
from .browser import headless_chromium, origins_loaded, severe_console_errors, wait
from .conftest import ROOT, TINY, FlowProcess, data_uri, free_port, make_image

pytest.importorskip('transformers')

CAPTIONED = 30
IMAGES = 5


def caption(i: int) -> str:
    return f'a photo of thing number {i}'


def captioned_uri(i: int) -> str:
    return data_uri(make_image(32, 24, seed=i))


def image_bytes(i: int) -> bytes:
    return make_image(40, 30, seed=500 + i)


@pytest.fixture(scope='module')
def served(tmp_path_factory):
    from clip_client import Client
    from docarray import Document

    folder = tmp_path_factory.mktemp('playground-search')
    checkpoint = cross_encoder_checkpoint(folder / 'tiny-reranker')
    config = yaml.safe_load((ROOT / 'flows' / 'search-rerank.yml').read_text())
    config['gateway']['port'] = ports = [free_port() for _ in range(3)]
    env = {
        'CLIPSERVE_MODEL': TINY,
        'CLIPSERVE_RERANK_MODEL': str(checkpoint),
        'CLIPSERVE_INDEX_PATH': str(folder / 'i'),
    }
    with FlowProcess(config, folder / 'flow', env):
        client = Client(f'grpc://127.0.0.1:{ports[0]}')
        tags = lambda i: {'n': i, 'parity': ['even', 'odd'][i % 2]}  # noqa: E731
        client.index([Document(uri=captioned_uri(i), text=caption(i), tags=tags(i)) for i in range(CAPTIONED)])
        client.index([Document(uri=data_uri(image_bytes(i)), tags={'image': i}) for i in range(IMAGES)])
        yield {'url': f'http://127.0.0.1:{ports[1]}', 'reranker': str(checkpoint)}


@pytest.fixture(scope='module')
def page(served, tmp_path_factory):
    with headless_chromium(tmp_path_factory.mktemp('chromium-profile')) as browser:
        browser.get(f'{served["url"]}/playground')
        wait(browser, "return !document.getElementById('search-controls').hidden", what='the search controls')
        browser.find_element('id', 'tab-search').click()
        yield browser
        assert origins_loaded(browser) == {served['url']}  # nothing from elsewhere: works offline
        assert not severe_console_errors(browser)


def search_api(served, body: dict) -> list[dict]:
    answer = requests.post(f'{served["url"]}/v1/search', json={'return_payload': True, **body}, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()['results']


def run(page, text: str | None = None, image=None) -> str:
    """Searches as a user does (types and presses enter, or picks a file) and waits for the page's answer."""
    page.execute_script("document.body.removeAttribute('data-search-state')")
    if image is not None:
        page.find_element('id', 'search-text').clear()
        page.find_element('id', 'search-image-input').send_keys(str(image))
    else:
        field = page.find_element('id', 'search-text')
        field.clear()
        field.send_keys(text + '\n')
    return wait(
        page, "return document.body.getAttribute('data-search-state')", what='the search', error_id='search-error'
    )


def set_field(page, field_id: str, value: str) -> None:
    field = page.find_element('id', field_id)
    field.clear()
    field.send_keys(value)


def shown(page) -> list[dict]:
    """The result cards, in the page's order: id, score, rerank score, caption, picture."""
    cards = []
    for card in page.find_elements('css selector', '#results figure.hit'):
        rerank = card.find_elements('css selector', 'span.rerank-score')
        caption_ = card.find_elements('css selector', 'div.caption')
        tags = card.find_elements('css selector', 'div.tags')
        pictures = card.find_elements('css selector', 'img')
        cards.append(
            {
                'id': card.get_attribute('data-id'),
                'score': float(card.find_element('css selector', 'span.score').get_attribute('data-score')),
                'rerank_score': float(rerank[0].get_attribute('data-rerank-score')) if rerank else None,
                'text': caption_[0].text if caption_ else None,
                'tags': json.loads(tags[0].text) if tags else None,
                'src': pictures[0].get_attribute('src') if pictures else None,
            }
        )
    return cards


def assert_same(cards: list[dict], results: list[dict]) -> None:
    assert [c['id'] for c in cards] == [r['id'] for r in results]
    assert [c['score'] for c in cards] == pytest.approx([r['score'] for r in results], abs=1e-6)
    assert [c['text'] for c in cards] == [r.get('text') for r in results]


def test_a_typed_caption_finds_its_own_image_first_as_a_picture(served, page):
    assert run(page, caption(7)) == 'done'
    cards = shown(page)
    assert len(cards) == 12  # the page's default number of results
    assert cards[0]['text'] == caption(7) and cards[0]['src'] == captioned_uri(7)
    painted = "const i = document.querySelector('#results figure.hit img'); return i && i.complete && i.naturalWidth"
    assert wait(page, painted, what='the first picture') == 32  # decoded: the CSP lets data: pictures in
    assert_same(cards, search_api(served, {'query': caption(7), 'top_k': 12}))
    if os.environ.get('CLIPSERVE_SCREENSHOT') == '1':  # docs/how-to/playground.md's picture
        assert page.save_screenshot(str(ROOT / 'docs' / 'playground-search.png'))


def test_a_picked_image_finds_itself(served, page, tmp_path):
    path = tmp_path / 'query.png'
    path.write_bytes(image_bytes(3))
    assert run(page, image=path) == 'done'
    cards = shown(page)
    assert cards[0]['src'] == data_uri(image_bytes(3)) and cards[0]['tags'] == {'image': 3}
    assert_same(cards, search_api(served, {'query': {'image': data_uri(image_bytes(3))}, 'top_k': 12}))
    assert page.find_elements('css selector', '#search-image img')  # the query image is shown
    page.find_element('css selector', '#search-image button').click()  # and can be removed


def test_the_rerank_option_gives_what_v1_search_gives(served, page):
    options = [o.get_attribute('value') for o in page.find_elements('css selector', '#reranker option')]
    assert options == [served['reranker']]
    page.find_element('id', 'rerank').click()
    set_field(page, 'top-n', '5')
    try:
        assert run(page, 'thing number 12') == 'done'
        cards = shown(page)
        body = {'query': 'thing number 12', 'top_k': 12, 'rerank': {'top_n': 5, 'model': served['reranker']}}
        results = search_api(served, body)
        assert len(cards) == 5 and all(c['rerank_score'] is not None for c in cards)
        assert_same(cards, results)
        assert [c['rerank_score'] for c in cards] == pytest.approx([r['rerank_score'] for r in results], abs=1e-6)
    finally:
        page.find_element('id', 'rerank').click()


def test_a_tag_filter_is_honoured_and_bad_ones_are_shown(served, page):
    odd = {'parity': {'$eq': 'odd'}}
    set_field(page, 'search-filter', json.dumps(odd))
    assert run(page, caption(4)) == 'done'
    cards = shown(page)
    assert cards and all(c['tags']['parity'] == 'odd' for c in cards)
    assert_same(cards, search_api(served, {'query': caption(4), 'top_k': 12, 'filter': odd}))

    set_field(page, 'search-filter', '{"parity": ')
    assert run(page, caption(4)) == 'error'
    assert 'The filter is not JSON' in page.find_element('id', 'search-error').text

    set_field(page, 'search-filter', '{"parity": {"$regex": "o"}}')
    assert run(page, caption(4)) == 'error'
    message = page.find_element('id', 'search-error').text
    assert '$regex' in message  # the server's own message, naming the operator it does not know

    set_field(page, 'top-k', '0')
    page.find_element('id', 'search-filter').clear()
    assert run(page, caption(4)) == 'error'
    assert 'top_k' in page.find_element('id', 'search-error').text

    set_field(page, 'top-k', '3')
    assert run(page, caption(4)) == 'done'  # the server kept serving
    assert [c['text'] for c in shown(page)][0] == caption(4) and len(shown(page)) == 3


def test_the_models_list_says_what_the_flow_can_do(served):
    answer = requests.get(f'{served["url"]}/v1/models', timeout=30).json()
    assert answer['capabilities'] == {'search': True, 'rerankers': [served['reranker']]}
