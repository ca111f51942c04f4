"""clip-as-service's (AnnLite's) filter syntax read into Qdrant's (index/filters.py), and run by both engines:
every operator returns exactly the documents it names, on the embedded engine and on qdrant-client's."""

import numpy as np
import pytest

from clipserve.errors import InvalidParameterError
from clipserve.index.edge import EdgeStore
from clipserve.index.filters import to_qdrant
from clipserve.index.points import Point
from clipserve.index.server import ServerStore
from clipserve.index.store import CollectionSettings

COLORS = ['red', 'blue', 'green']


def tags(i: int) -> dict:
    # numbers as Jina carries them: floats (a protobuf Struct has no integers)
    return {'color': COLORS[i % 3], 'price': float(i * 10), 'sale': i % 2 == 0}


@pytest.fixture(params=['edge', 'client'])
def store(request, tmp_path):
    settings = CollectionSettings(columns=(('color', 'str'), ('price', 'float')))
    made = (
        EdgeStore(tmp_path / 'index', settings) if request.param == 'edge' else ServerStore(':memory:', 'c', settings)
    )
    vectors = np.random.default_rng(0).normal(size=(12, 8)).astype(np.float32)
    made.upsert([Point(f'doc{i}', vectors[i], {'tags': tags(i)}) for i in range(12)])
    yield made
    made.close()


def found(store, annlite_filter) -> set[int]:
    hits = store.search([np.ones(8, np.float32)], 100, to_qdrant(annlite_filter))[0]
    return {int(h.document_id[3:]) for h in hits}


def expected(predicate) -> set[int]:
    return {i for i in range(12) if predicate(tags(i))}


@pytest.mark.parametrize(
    'annlite_filter, predicate',
    [
        ({'color': {'$eq': 'red'}}, lambda t: t['color'] == 'red'),
        ({'color': 'red'}, lambda t: t['color'] == 'red'),  # a bare value is $eq
        ({'color': {'$ne': 'red'}}, lambda t: t['color'] != 'red'),
        ({'price': {'$eq': 30}}, lambda t: t['price'] == 30),  # an integer matches the stored float
        ({'price': {'$gt': 30}}, lambda t: t['price'] > 30),
        ({'price': {'$gte': 30, '$lt': 70}}, lambda t: 30 <= t['price'] < 70),
        ({'price': {'$lte': 20}}, lambda t: t['price'] <= 20),
        ({'color': {'$in': ['red', 'green']}}, lambda t: t['color'] in ('red', 'green')),
        ({'color': {'$nin': ['red', 'green']}}, lambda t: t['color'] not in ('red', 'green')),
        ({'price': {'$in': [10, 40, 110]}}, lambda t: t['price'] in (10, 40, 110)),
        ({'sale': True}, lambda t: t['sale']),
        ({'color': 'blue', 'price': {'$lt': 60}}, lambda t: t['color'] == 'blue' and t['price'] < 60),
        (
            {'$or': [{'color': 'red'}, {'$and': [{'sale': True}, {'price': {'$gt': 80}}]}]},
            lambda t: t['color'] == 'red' or (t['sale'] and t['price'] > 80),
        ),
        (
            {'$and': [{'color': {'$ne': 'blue'}}, {'price': {'$lt': 50}}]},
            lambda t: t['color'] != 'blue' and t['price'] < 50,
        ),
    ],
)
def test_each_annlite_operator_returns_exactly_the_documents_it_names(store, annlite_filter, predicate):
    assert found(store, annlite_filter) == expected(predicate)
    assert store.count(to_qdrant(annlite_filter)) == len(expected(predicate))


def test_qdrants_own_filter_passes_through(store):
    qdrant = {'must': [{'key': 'tags.color', 'match': {'value': 'green'}}]}
    assert to_qdrant(qdrant) is qdrant
    assert found(store, qdrant) == expected(lambda t: t['color'] == 'green')


@pytest.mark.parametrize(
    'bad, words',
    [
        ('red', 'must be an object'),
        ({'color': {'$like': 'r%'}}, "unknown operator '$like'"),
        ({'$xor': []}, "unknown operator '$xor'"),
        ({'$or': {'color': 'red'}}, 'must be a list of filters'),
        ({'price': {'$gt': 'ten'}}, 'must be a finite number'),
        ({'price': {'$lt': float('nan')}}, 'must be a finite number'),
        ({'color': {'$in': []}}, 'non-empty list'),
        ({'color': {'$eq': [1]}}, 'a string, a number or true/false'),
    ],
)
def test_a_filter_it_cannot_read_is_an_error_naming_the_part(bad, words):
    with pytest.raises(InvalidParameterError, match=words.replace('$', r'\$').replace('(', r'\(')):
        to_qdrant(bad)


def test_no_filter_is_none():
    assert to_qdrant(None) is None and to_qdrant({}) is None
