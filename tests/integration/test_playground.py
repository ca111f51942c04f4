"""The playground page in a real headless browser (Debian's chromium, driven by Selenium), and model picking
on the OpenAI-compatible routes, through one Flow: flows/multi-model.yml (gRPC + HTTP) with two small models
and the token of ClipServeGateway.

The page is loaded, asks for the token, gets it typed in; two texts and an image are added; the scores it
shows are read back and compared with what /v1/rank answers. The browser runs with its background
networking off, and every request the page makes is checked to go to the gateway: nothing from a CDN.

CI (CI=true) must have chromium and chromedriver (browser.py). CLIPSERVE_SCREENSHOT=1 saves the page as
docs/playground.png (the README's picture).
"""

import io
import json
import os

import pytest
import requests
from PIL import Image, ImageDraw

from .browser import headless_chromium, origins_loaded, severe_console_errors, wait
from .conftest import ROOT, TINY, data_uri, flow_from_yaml, free_port, set_port

TOKEN = 'playground-token'
TEXTS = ['a red circle', 'a blue square']


@pytest.fixture(scope='module')
def arch32(tmp_path_factory):
    """A second small model: the tiny architecture with 32-d embeddings, as a JSON config at random weights."""
    config = json.loads((ROOT / 'executors/clipserve/models/configs/clipserve-tiny.json').read_text())
    config['embed_dim'] = 32
    path = tmp_path_factory.mktemp('arch') / 'tiny32.json'
    path.write_text(json.dumps(config))
    return f'{path}::random'


@pytest.fixture(scope='module')
def served(tmp_path_factory, arch32):
    ports = [free_port(), free_port()]

    def edit(config):
        set_port(config, ports)
        config['gateway']['uses'] = 'ClipServeGateway'
        config['gateway']['uses_with'] = {'auth': 'required'}
        for executor, model in zip(config['executors'], (TINY, arch32)):
            executor['uses']['with']['name'] = model
            executor['uses']['with']['served_models'] = [TINY, arch32]

    flow = flow_from_yaml('multi-model.yml', tmp_path_factory.mktemp('flows'), edit)
    os.environ['CLIPSERVE_AUTH_TOKEN'] = TOKEN
    try:
        with flow:
            yield {'url': f'http://127.0.0.1:{ports[1]}', 'models': (TINY, arch32)}
    finally:
        os.environ.pop('CLIPSERVE_AUTH_TOKEN', None)


def api(served, path, body=None):
    headers = {'Authorization': f'Bearer {TOKEN}'}
    if body is None:
        return requests.get(f'{served["url"]}/v1{path}', headers=headers, timeout=60)
    return requests.post(f'{served["url"]}/v1{path}', json=body, headers=headers, timeout=60)


# ---- model picking --------------------------------------------------------------------------------


def test_models_lists_both_models_the_default_first(served):
    small, other = served['models']
    models = api(served, '/models').json()['data']
    assert [(m['id'], m['embedding_dimensions'], m['default']) for m in models] == [
        (small, 64, True),
        (other, 32, False),
    ]


def test_model_picks_the_executor_like_encode_model(served):
    small, other = served['models']
    sizes = {
        name: len(
            api(served, '/embeddings', {'input': ['a dog'], **({'model': name} if name else {})}).json()['data'][0][
                'embedding'
            ]
        )
        for name in (small, other, None)
    }
    assert sizes == {small: 64, other: 32, None: 64}
    ranked = api(served, '/rank', {'model': other, 'query': 'a dog', 'documents': ['a', 'b']}).json()
    assert ranked['model'] == other and len(ranked['results']) == 2
    unknown = api(served, '/embeddings', {'model': 'ViT-H-14::laion2b-s32b-b79k', 'input': 'a'})
    assert unknown.status_code == 404
    assert small in unknown.json()['error']['message'] and other in unknown.json()['error']['message']


# ---- the page in a browser ------------------------------------------------------------------------


def shapes() -> bytes:
    image = Image.new('RGB', (160, 120), (245, 245, 240))
    draw = ImageDraw.Draw(image)
    draw.ellipse((20, 20, 100, 100), fill=(210, 40, 40))
    draw.rectangle((110, 60, 150, 100), fill=(40, 80, 200))
    buf = io.BytesIO()
    image.save(buf, format='PNG')
    return buf.getvalue()


@pytest.fixture(scope='module')
def browser(tmp_path_factory):
    with headless_chromium(tmp_path_factory.mktemp('chromium-profile')) as chrome:
        yield chrome


def compare_and_wait(browser):
    browser.execute_script("document.body.removeAttribute('data-state')")
    browser.find_element('id', 'compare').click()
    return wait(browser, "return document.body.getAttribute('data-state')", what='the comparison')


def page_scores(browser, section):
    """{(query key, candidate index): (clip_score shown, clip_score in full, cosine)} of a rankings section."""
    found = {}
    for span in browser.find_elements('css selector', f'#{section} span.score'):
        key = (span.get_attribute('data-query'), int(span.get_attribute('data-index')))
        found[key] = (
            float(span.text),
            float(span.get_attribute('data-clip-score')),
            float(span.get_attribute('data-cosine')),
        )
    return found


def test_the_playground_shows_the_scores_rank_computes(served, browser, tmp_path):
    small, other = served['models']
    image_path = tmp_path / 'shapes.png'
    image_path.write_bytes(shapes())
    browser.get(f'{served["url"]}/playground')
    # the server has a token: the page asks for it
    wait(browser, "return document.getElementById('auth').classList.contains('shown')", what='the token prompt')
    browser.find_element('id', 'token').send_keys(TOKEN)
    browser.find_element('id', 'token-save').click()
    wait(browser, "return document.getElementById('model').options.length == 2", what='the model picker')
    assert browser.find_element('id', 'model').get_attribute('value') == small
    for text in TEXTS:
        browser.find_element('id', 'text-input').send_keys(text + '\n')
    browser.find_element('id', 'image-input').send_keys(str(image_path))
    wait(browser, "return document.querySelectorAll('#images img').length == 1", what='the image')
    assert [li.text.split('\n')[0] for li in browser.find_elements('css selector', '#texts li span.label')] == TEXTS
    assert compare_and_wait(browser) == 'done'

    image = data_uri(image_path.read_bytes())
    for model in (small, other):
        if model == other:  # the picker: the same inputs through the other model
            from selenium.webdriver.support.ui import Select

            Select(browser.find_element('id', 'model')).select_by_value(other)
            assert compare_and_wait(browser) == 'done'
        if model == small and os.environ.get('CLIPSERVE_SCREENSHOT') == '1':
            (ROOT / 'docs').mkdir(exist_ok=True)
            height = browser.execute_script('return document.documentElement.scrollHeight')
            browser.set_window_size(1280, height + 40)
            assert browser.save_screenshot(str(ROOT / 'docs' / 'playground.png'))
        # for the image, the texts ranked
        expected = api(served, '/rank', {'model': model, 'query': image, 'documents': TEXTS}).json()['results']
        shown = page_scores(browser, 'image-rankings')
        assert sorted(shown) == [('image-0', 0), ('image-0', 1)]
        for r in expected:
            text, full, cosine = shown[('image-0', r['index'])]
            assert abs(full - r['clip_score']) < 1e-6 and abs(text - r['clip_score']) < 6e-5
            assert abs(cosine - r['clip_score_cosine']) < 1e-6
        order = [
            int(s.get_attribute('data-index'))
            for s in browser.find_elements('css selector', '#image-rankings span.score')
        ]
        assert order == [r['index'] for r in expected]
        # for each text, the images ranked (one image: its softmax is 1)
        for i, text in enumerate(TEXTS):
            [r] = api(served, '/rank', {'model': model, 'query': text, 'documents': [image]}).json()['results']
            assert abs(page_scores(browser, 'text-rankings')[(f'text-{i}', 0)][1] - r['clip_score']) < 1e-6
        # the similarity matrix: cosines of the embeddings, which /v1/rank reports as clip_score_cosine
        cells = {
            cell.get_attribute('data-column'): float(cell.get_attribute('data-cosine'))
            for cell in browser.find_elements('css selector', '#matrix td.cell')
        }
        for r in expected:
            assert abs(cells[f'text-{r["index"]}'] - r['clip_score_cosine']) < 1e-5

    # a file that is not an image: the page shows the server's error, naming the item
    bad = tmp_path / 'not-an-image.png'
    bad.write_bytes(b'this is not a png')
    browser.find_element('id', 'image-input').send_keys(str(bad))
    wait(browser, "return document.querySelectorAll('#images img').length == 2", what='the second image')
    assert compare_and_wait(browser) == 'error'
    assert 'input[3]' in browser.find_element('id', 'error').text

    # everything the page loaded came from the gateway (or was a data:/blob: URL): no CDN, works offline
    assert origins_loaded(browser) == {served['url']}
    assert not severe_console_errors(browser)


def test_the_page_is_open_but_carries_no_secret(served):
    page = requests.get(f'{served["url"]}/playground', timeout=30)
    assert page.status_code == 200 and page.headers['content-type'].startswith('text/html')
    assert "connect-src 'self'" in page.headers['content-security-policy']
    assert TOKEN not in page.text and 'http://' not in page.text and 'https://' not in page.text
    assert requests.get(f'{served["url"]}/v1/models', timeout=30).status_code == 401


def test_the_search_tab_says_when_the_flow_has_no_index(served, browser):
    browser.get(f'{served["url"]}/playground')
    wait(browser, "return document.getElementById('auth').classList.contains('shown')", what='the token prompt')
    browser.find_element('id', 'token').send_keys(TOKEN)
    browser.find_element('id', 'token-save').click()
    wait(browser, "return document.getElementById('model').options.length == 2", what='the model picker')
    browser.find_element('id', 'tab-search').click()
    assert browser.find_element('id', 'compare-view').get_attribute('hidden') is not None
    assert 'This Flow has no index' in browser.find_element('id', 'no-index').text
    assert not browser.find_element('id', 'search-controls').is_displayed()
    assert api(served, '/models').json()['capabilities'] == {'search': False, 'rerankers': []}
