"""Filters: clip-as-service's (AnnLite's) syntax read into Qdrant's own filter, and Qdrant's filter as is.

AnnLite filtered on a document's tags with MongoDB-like operators:

    {"color": {"$eq": "red"}, "price": {"$lt": 50}}          # every condition (an implicit $and)
    {"$or": [{"color": {"$in": ["red", "blue"]}}, {"$and": [...]}]}

`$eq`, `$ne`, `$gt`, `$gte`, `$lt`, `$lte`, `$in`, `$nin`, `$and`, `$or`; a bare value is `$eq`. A field
names a tag (`tags.<field>` in the payload). Qdrant's own JSON filter (`{"must": [...], "should": [...],
"must_not": [...]}` over payload paths: `tags.color`, `text`, `uri`) passes through unchanged, so either
syntax works wherever a filter is taken. The result is always Qdrant's JSON filter, which both engines read
(edge.py turns it into qdrant-edge's classes; qdrant-client parses it itself).

Numbers are compared as ranges, never as exact matches: Jina carries tags and parameters as protobuf
Structs, where every number is a float (a tag `2` is stored as `2.0`), and Qdrant's exact match reads only
integers and strings.
"""

from __future__ import annotations

import math
from numbers import Real

from clipserve.errors import InvalidParameterError

TAGS_PREFIX = 'tags.'
QDRANT_KEYS = {'must', 'should', 'must_not', 'min_should'}
RANGES = {'$gt': 'gt', '$gte': 'gte', '$lt': 'lt', '$lte': 'lte'}
OPERATORS = ('$eq', '$ne', '$in', '$nin', *RANGES, '$and', '$or')


def to_qdrant(filter_: dict | None, where: str = 'filter') -> dict | None:
    """Qdrant's JSON filter for `filter_` (AnnLite's syntax or Qdrant's own), or None for no filter; an
    InvalidParameterError naming `where` and the part it cannot read otherwise."""
    if filter_ is None or filter_ == {}:
        return None
    if not isinstance(filter_, dict):
        raise InvalidParameterError(f'{where} must be an object, got {type(filter_).__name__}')
    if set(filter_) <= QDRANT_KEYS:
        return filter_
    return {'must': _conditions(filter_, where)}


def _conditions(filter_: dict, where: str) -> list[dict]:
    conditions = []
    for key, value in filter_.items():
        if key in ('$and', '$or'):
            if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
                raise InvalidParameterError(f'{where}.{key} must be a list of filters, got {value!r}')
            parts = [{'must': _conditions(v, f'{where}.{key}[{i}]')} for i, v in enumerate(value)]
            conditions.append({'must': parts} if key == '$and' else {'should': parts})
        elif key.startswith('$'):
            raise InvalidParameterError(f'{where}: unknown operator {key!r}; the operators are {", ".join(OPERATORS)}')
        else:
            conditions.extend(_field(TAGS_PREFIX + key, value, f'{where}.{key}'))
    return conditions


def _field(key: str, value, where: str) -> list[dict]:
    ops = value if isinstance(value, dict) else {'$eq': value}
    conditions, bounds = [], {}
    for op, operand in ops.items():
        if op in RANGES:
            bounds[RANGES[op]] = _number(operand, f'{where}.{op}')
        elif op == '$eq':
            conditions.append(_equals(key, operand, f'{where}.$eq'))
        elif op == '$ne':
            conditions.append({'must_not': [_equals(key, operand, f'{where}.$ne')]})
        elif op in ('$in', '$nin'):
            if not isinstance(operand, list) or not operand:
                raise InvalidParameterError(f'{where}.{op} must be a non-empty list, got {operand!r}')
            anyof = {'should': [_equals(key, v, f'{where}.{op}[{i}]') for i, v in enumerate(operand)]}
            conditions.append(anyof if op == '$in' else {'must_not': [anyof]})
        else:
            raise InvalidParameterError(f'{where}: unknown operator {op!r}; the operators are {", ".join(OPERATORS)}')
    if bounds:
        conditions.append({'key': key, 'range': bounds})
    return conditions


def _equals(key: str, value, where: str) -> dict:
    if isinstance(value, bool) or isinstance(value, str):
        return {'key': key, 'match': {'value': value}}
    if isinstance(value, Real):
        number = _number(value, where)
        return {'key': key, 'range': {'gte': number, 'lte': number}}
    raise InvalidParameterError(f'{where} must be a string, a number or true/false, got {value!r}')


def _number(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise InvalidParameterError(f'{where} must be a finite number, got {value!r}')
    return float(value)
