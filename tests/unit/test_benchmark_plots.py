"""benchmarks/plots.py draws each published result file (what the docs site shows) and knows the overload
benchmark's refusal outcomes as the benchmark writes them."""

import json
from pathlib import Path

import pytest

from benchmarks import plots
from benchmarks.overload_helpers import REFUSED, UNCLEAR

PUBLISHED = sorted(Path(plots.PUBLISHED).glob('*.json'))


@pytest.mark.parametrize('source', PUBLISHED, ids=[p.stem for p in PUBLISHED])
def test_each_published_result_is_drawn(source, tmp_path):
    pytest.importorskip('matplotlib')
    assert source.stem in plots.DRAWERS, f'{source.name} has no drawer in benchmarks/plots.py'
    assert plots.DRAWERS[source.stem](json.loads(source.read_text()), tmp_path / 'plot.png')
    assert (tmp_path / 'plot.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_draw_all_draws_only_what_has_a_result(tmp_path):
    pytest.importorskip('matplotlib')
    (tmp_path / 'in').mkdir()
    (tmp_path / 'in' / 'rerank.json').write_text((plots.PUBLISHED / 'rerank.json').read_text())
    (tmp_path / 'in' / 'unknown.json').write_text('{}')
    assert plots.draw_all(tmp_path / 'in', tmp_path / 'out') == ['rerank']
    assert [p.name for p in (tmp_path / 'out').iterdir()] == ['rerank.png']


def test_the_overload_plot_marks_the_benchmarks_refusals():
    assert set(plots.REFUSED_STATUSES) == {REFUSED, UNCLEAR}
