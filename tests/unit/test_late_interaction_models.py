"""Late-interaction checkpoints (ColPali, ColQwen2; `transformers:/folder`): tiny random configs of both built by
the tests (tests/late_interaction_folders.py), tokenized, preprocessed, embedded and scored as transformers' own
processor (with its PIL image processor), model and `processor.score_retrieval` do it; what clipserve decides
itself (right padding, the cut of a long query, the output's fixed token rows, bf16 on both towers) and the
refusals. MaxSim's own math is tests/unit/test_token_vectors.py's; the served doors are
tests/integration/test_late_interaction_flow.py's."""

import json
import shutil

import numpy as np
import pytest
from PIL import Image

from clipserve.backends import BackendOptions, create_backend
from clipserve.engine import ranking
from clipserve.engine.token_vectors import token_rows
from clipserve.errors import UnknownModelError
from clipserve.models.names import parse_model_name
from clipserve.models.preprocess import ImageError, preprocess_image
from clipserve.models.registry import resolve

from ..compare import relative_error
from ..late_interaction_folders import EMBEDDING_DIM, LATE_TYPES, late_interaction_checkpoint, reference

torch = pytest.importorskip('torch')
pytest.importorskip('transformers')

QUERIES = [
    'a cat',
    'What was the revenue of the company in 2020?',
    '',
    'Café CRÈME brûlée — à la carte!',
    '東京の夜景と北京烤鸭',
    'emoji 🐶🎉 and © ™',
]
# (width, height): both orientations, already at the size, tiny (upscaled), an extreme strip
SIZES = [(45, 61), (80, 33), (32, 32), (100, 47), (5, 4), (7, 300)]


@pytest.fixture(scope='module')
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp('late')
    return {kind: late_interaction_checkpoint(root / kind, kind) for kind in LATE_TYPES}


@pytest.fixture(scope='module')
def backends(folders):
    return {
        kind: create_backend('torch', f'transformers:{folder}', BackendOptions(device='cpu', dtype='fp32'))
        for kind, folder in folders.items()
    }


@pytest.fixture(scope='module')
def references(folders):
    return {kind: reference(folder, kind) for kind, folder in folders.items()}


def _images(sizes=SIZES):
    rng = np.random.default_rng(3)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]


def _pixels(backend, images):
    return np.stack([preprocess_image(image, backend.preprocess) for image in images])


def test_the_facts_come_from_the_checkpoints_files(folders):
    colpali = resolve(parse_model_name(f'transformers:{folders["colpali"]}'))
    assert (
        colpali.family == 'late-interaction' and colpali.output.late_interaction and colpali.embed_dim == EMBEDDING_DIM
    )
    assert colpali.preprocess.resize_mode == 'squash' and colpali.preprocess.image_size == 32
    suffix = colpali.model_cfg['image_prompt']['suffix_ids']
    assert colpali.output.image_tokens == 16 + len(suffix)  # <image> x 16, then the prompt
    assert colpali.text.prompt_prefix == '<bos>Question: ' and colpali.text.prompt_suffix == '<pad>' * 10 + '\n'
    qwen = resolve(parse_model_name(f'transformers:{folders["colqwen2"]}'))
    config = qwen.preprocess
    assert (config.resize_mode, config.patch_size, config.merge_size, config.pixel_range) == (
        'qwen2',
        4,
        2,
        (256, 1024),
    )
    assert qwen.text.prompt_prefix == 'Query: ' and qwen.text.prompt_suffix == '<|endoftext|>' * 10 + '\n'
    assert qwen.context_length == 256  # MAX_QUERY_TOKENS: under the tokenizer's 32,768 and the positions


@pytest.mark.parametrize('kind', LATE_TYPES)
def test_queries_tokenize_and_embed_as_the_processor_and_model_do(backends, references, kind):
    backend, (processor, model) = backends[kind], references[kind]
    assert backend.output.late_interaction and backend.trims_padding
    tokens = backend.tokenizer(QUERIES)
    for row, query in enumerate(QUERIES):
        want = processor.process_queries([query])
        assert tokens.input_ids[row, : tokens.lengths[row]].tolist() == want['input_ids'][0].tolist(), query
    got = backend.encode_texts(tokens.input_ids, tokens.attention_mask)
    assert got.shape == (len(QUERIES), backend.context_length, EMBEDDING_DIM)
    vectors = token_rows(got)
    with torch.no_grad():
        alone = [model(**processor.process_queries([q])).embeddings[0].numpy() for q in QUERIES]
        batch = processor.process_queries(QUERIES)  # transformers pads ColPali's on the left, ColQwen2's on the right
        together = model(**batch).embeddings.numpy()
    for row, want in enumerate(alone):
        assert vectors[row].shape == want.shape  # one vector per token, the padding rows dropped
        assert relative_error(vectors[row], want) <= 1e-5
        mask = batch['attention_mask'][row].numpy().astype(bool)
        assert relative_error(vectors[row], together[row][mask]) <= 1e-5  # a batch changes nothing
    np.testing.assert_allclose(np.linalg.norm(vectors[0], axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize('kind', LATE_TYPES)
def test_pages_preprocess_and_embed_as_the_processor_and_model_do(backends, references, kind):
    backend, (processor, model) = backends[kind], references[kind]
    images = _images()
    pixels = _pixels(backend, images)
    got = token_rows(backend.encode_images(pixels))
    with torch.no_grad():
        for row, image in enumerate(images):
            inputs = processor.process_images([image])
            want = model(**inputs).embeddings[0].numpy()
            if kind == 'colpali':
                assert np.abs(pixels[row] - inputs['pixel_values'][0].numpy()).max() <= 1e-6
            else:  # the layout carries the patches once (the model repeats them in time) and the grid
                patches = inputs['pixel_values'][0].numpy().reshape(len(inputs['pixel_values'][0]), 3, 2, 16)[:, :, 0]
                count = len(patches)
                assert np.abs(pixels[row, :count, :-3] - patches.reshape(count, -1)).max() <= 1e-6
                grid = inputs['image_grid_thw'][0].tolist()
                assert [1, *pixels[row, :, -2:].sum(axis=0).astype(int).tolist()] == grid
                assert pixels[row, :, -3].sum() == count == grid[1] * grid[2]
            assert got[row].shape == want.shape, image.size
            assert relative_error(got[row], want) <= 1e-5


@pytest.mark.parametrize('kind', LATE_TYPES)
def test_maxsim_ranking_equals_score_retrieval(backends, references, kind):
    backend, (processor, model) = backends[kind], references[kind]
    images = _images()
    tokens = backend.tokenizer(QUERIES)
    queries = token_rows(backend.encode_texts(tokens.input_ids, tokens.attention_mask))
    pages = token_rows(backend.encode_images(_pixels(backend, images)))
    with torch.no_grad():
        want_q = [model(**processor.process_queries([q])).embeddings[0] for q in QUERIES]
        want_p = [model(**processor.process_images([im])).embeddings[0] for im in images]
    # score_retrieval pads a list of pages of different lengths with zero vectors, which then compete in the max;
    # page by page it is MaxSim exactly
    want = torch.cat([processor.score_retrieval(want_q, [page]) for page in want_p], dim=1).numpy()
    got = ranking.maxsim(queries, pages)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    np.testing.assert_array_equal(np.argsort(-got, axis=1, kind='stable'), np.argsort(-want, axis=1, kind='stable'))


def test_a_query_over_the_context_keeps_its_prompt_and_suffix(backends):
    tokenizer = backends['colqwen2'].tokenizer
    long = ' '.join(['the quick brown fox jumps over the lazy dog'] * 40)
    batch = tokenizer([long, 'short'])
    assert batch.lengths.tolist()[0] == tokenizer.context_length == batch.input_ids.shape[1]
    from tokenizers import Tokenizer

    whole = Tokenizer.from_file(str(backends['colqwen2'].model_name.split(':', 1)[1] + '/tokenizer.json'))
    full = whole.encode(f'{tokenizer.prefix}{long}{tokenizer.suffix}', add_special_tokens=False).ids
    ids, kept = batch.input_ids[0].tolist(), tokenizer.context_length - 11
    assert len(full) > len(ids) and ids[:kept] == full[:kept]  # the prompt and as much text as fits
    assert ids[kept:] == full[-11:] == whole.encode('<|endoftext|>' * 10 + '\n').ids  # the augmentation kept
    assert batch.attention_mask[1].sum() == len(tokenizer.token_ids('short')) < tokenizer.context_length


def test_an_image_whose_patches_exceed_the_layout_is_refused_by_name(backends):
    config = backends['colqwen2'].preprocess
    assert config.max_num_patches >= 1024 // 16  # room for the strips smart_resize keeps one patch window wide
    with pytest.raises(ImageError, match='aspect ratio'):
        preprocess_image(Image.new('RGB', (1, 300)), config)  # 300:1, over smart_resize's 200


def test_a_transformers_4_layout_reads_the_same(folders, backends, tmp_path):
    """transformers 4 saved the image processor as preprocessor_config.json beside a processor_config.json."""
    folder = tmp_path / 'v4'
    shutil.copytree(folders['colqwen2'], folder)
    processor = json.loads((folder / 'processor_config.json').read_text())
    image = processor.pop('image_processor')
    image.update(min_pixels=256, max_pixels=1024, size={'min_pixels': 1, 'max_pixels': 2})  # top level wins
    (folder / 'preprocessor_config.json').write_text(json.dumps(image))
    (folder / 'processor_config.json').write_text(json.dumps(processor))
    assert resolve(parse_model_name(f'transformers:{folder}')).preprocess == backends['colqwen2'].preprocess


def test_refusals_name_the_problem(folders, tmp_path):
    with pytest.raises(UnknownModelError, match='late-interaction model, not trained for truncation'):
        resolve(parse_model_name(f'transformers:{folders["colpali"]}'), truncate_dim=8)
    folder = tmp_path / 'mismatch'
    shutil.copytree(folders['colpali'], folder)
    config = json.loads((folder / 'config.json').read_text())
    config['vlm_config']['image_token_id'] = 3
    (folder / 'config.json').write_text(json.dumps(config))
    with pytest.raises(UnknownModelError, match='the processor and the model disagree'):
        resolve(parse_model_name(f'transformers:{folder}'))


def test_auto_on_a_bf16_cpu_runs_pages_and_queries_in_bf16(folders, backends, monkeypatch):
    """A page runs the language model the queries run: one precision for both, even where the precision table
    gives the towers different ones (bf16 images, fp32 texts)."""
    from clipserve.backends import precision

    monkeypatch.setenv(precision.CPU_BF16_ENV, '1')
    monkeypatch.setitem(precision.CPU_BF16_AUTO, 'torch', ('bf16', 'fp32'))
    precision.cpu_bf16.cache_clear()
    try:
        auto = create_backend('torch', f'transformers:{folders["colqwen2"]}', BackendOptions(device='cpu'))
    finally:
        precision.cpu_bf16.cache_clear()
    assert auto.dtype == 'bf16' and 'late interaction' in auto.precision.reason
    assert {p.dtype for p in auto.model.parameters()} == {torch.bfloat16}
    pixels = _pixels(auto, _images()[:2])
    got, want = token_rows(auto.encode_images(pixels)), token_rows(backends['colqwen2'].encode_images(pixels))
    for g, w in zip(got, want):
        assert g.shape == w.shape and (g * w).sum(1).min() > 0.95  # unit vectors: the cosine per token


def test_no_onnx_export_and_no_bulk_job_for_multi_vector_models(folders, tmp_path):
    """The export refuses before building anything (docs/late-interaction.md says why); a bulk job writes one
    vector per row, so it refuses too rather than write a wrong shape."""
    from clipserve.backends.onnx.export import ExportError, export_onnx
    from clipserve.jobs.bridge import load_model

    with pytest.raises(ExportError, match='late-interaction model .*torch backend'):
        export_onnx(f'transformers:{folders["colpali"]}', tmp_path / 'out')
    assert not (tmp_path / 'out').exists()
    with pytest.raises(UnknownModelError, match='bulk embedding writes one vector per row'):
        load_model('torch', f'transformers:{folders["colqwen2"]}', 'cpu', 'fp32', None, 4)
