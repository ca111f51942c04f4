"""How a setting is read: its declaration (Setting), its value from an argument, its environment variable or
its default, checked against its type and range, and a table of them read into one typed, frozen object.

The tables themselves are config/settings.py (executors), config/indexer_settings.py, config/reranker_settings.py
and config/gateway_settings.py (the gateway); each process reads its own table once, at start.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass
from typing import Any, Optional

from clipserve.config.parameters import check_bool, env_or_default
from clipserve.errors import InvalidParameterError


@dataclass(frozen=True)
class Setting:
    name: str
    kind: str  # str, int, float, bool, list, choice
    default: Any
    description: str
    env: str | None = None  # default CLIPSERVE_<NAME>; '' for none
    minimum: float | None = None
    choices: tuple[str, ...] = ()
    section: str = 'model'

    @property
    def variable(self) -> str | None:
        return None if self.env == '' else (self.env or f'CLIPSERVE_{self.name.upper()}')


def read_setting(setting: Setting, given, environ=None):
    """The value of one setting: the argument if given, else its environment variable, else its default."""
    environ = os.environ if environ is None else environ
    value = env_or_default(given, None)
    source = 'argument'
    if value is None and setting.variable:
        value = env_or_default(environ.get(setting.variable), None)
        source = setting.variable
    if value is None:
        return setting.default
    return convert(setting, value, source)


def convert(setting: Setting, value, source: str = 'argument'):
    """`value` as the setting's type, checked; InvalidParameterError naming the setting (and the source) if not."""
    where = f'{setting.name!r}' + (f' (from {source})' if source != 'argument' else '')
    kind = setting.kind
    if kind == 'bool':
        if isinstance(value, str) and value.strip().lower() in ('1', 'yes', 'on', '0', 'no', 'off'):
            return value.strip().lower() in ('1', 'yes', 'on')
        try:
            return check_bool(setting.name, value.strip() if isinstance(value, str) else value)
        except InvalidParameterError:
            raise InvalidParameterError(f'{where} must be true or false, got {value!r}') from None
    if kind in ('int', 'float'):
        return _number(setting, value, where)
    if kind == 'list':
        return _list(value, where)
    if kind == 'columns':
        return _columns(value, where)
    text = str(value).strip()
    if kind == 'choice' and text not in setting.choices:
        raise InvalidParameterError(f'{where} must be one of {", ".join(setting.choices)}, got {value!r}')
    return text


def _number(setting: Setting, value, where: str):
    wanted = 'an integer' if setting.kind == 'int' else 'a number'
    bound = f' >= {setting.minimum:g}' if setting.minimum is not None else ''
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidParameterError(f'{where} must be {wanted}{bound}, got {value!r}')
    try:
        number = float(value)
    except ValueError:
        raise InvalidParameterError(f'{where} must be {wanted}{bound}, got {value!r}') from None
    if not math.isfinite(number) or (setting.kind == 'int' and not number.is_integer()):
        raise InvalidParameterError(f'{where} must be {wanted}{bound}, got {value!r}')
    if setting.minimum is not None and number < setting.minimum:
        raise InvalidParameterError(f'{where} must be {wanted}{bound}, got {value!r}')
    return int(number) if setting.kind == 'int' else number


def _list(value, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        items = value.split(',')
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        raise InvalidParameterError(f'{where} must be a list or a comma-separated string, got {value!r}')
    out = []
    for item in items:
        if not isinstance(item, (str, int, float)) or isinstance(item, bool):
            raise InvalidParameterError(f'{where}: every item must be a string, got {item!r}')
        if str(item).strip():
            out.append(str(item).strip())
    return tuple(out)


COLUMN_TYPES = ('str', 'int', 'float', 'bool')


def _columns(value, where: str) -> tuple[tuple[str, str], ...]:
    """(name, type) pairs: AnnLite's `[[name, type], ...]`, or `name:type,name:type` (environment variables)."""
    items = [item.split(':', 1) if isinstance(item, str) else item for item in _list_or_pairs(value, where)]
    out = []
    for item in items:
        if not isinstance(item, (list, tuple)) or len(item) != 2 or str(item[1]).strip() not in COLUMN_TYPES:
            raise InvalidParameterError(
                f'{where}: every column is [name, type] (or name:type) with type one of {", ".join(COLUMN_TYPES)}, '
                f'got {item!r}'
            )
        out.append((str(item[0]).strip(), str(item[1]).strip()))
    return tuple(out)


def _list_or_pairs(value, where: str) -> list:
    if isinstance(value, str):
        return [v.strip() for v in value.split(',') if v.strip()]
    if isinstance(value, (list, tuple)):
        return list(value)
    raise InvalidParameterError(f'{where} must be a list of [name, type] pairs or "name:type,...", got {value!r}')


_TYPES = {
    'str': Optional[str],
    'int': Optional[int],
    'float': Optional[float],
    'bool': bool,
    'list': tuple[str, ...],
    'choice': str,
    'columns': tuple[tuple[str, str], ...],
}


@functools.cache
def settings_type(table: tuple[Setting, ...], name: str) -> type:
    """The frozen dataclass of a table's values: one typed attribute per setting, and `warnings` (the
    deprecated arguments that were used). Unknown attributes are errors, values cannot change after start."""
    fields = [(s.name, _TYPES[s.kind]) for s in table]
    fields.append(('warnings', tuple[str, ...], dataclasses.field(default=())))
    return dataclasses.make_dataclass(name, fields, frozen=True, slots=True)


def read_settings(table: tuple[Setting, ...], arguments: dict, environ=None, name: str = 'Settings', **adjusted):
    """Every setting of `table` from `arguments` (constructor arguments), the environment and the defaults, as
    one `settings_type(table, name)`; `adjusted`: values the caller has already worked out (e.g. `warnings`)."""
    unknown = set(arguments) - {s.name for s in table}
    if unknown:
        raise InvalidParameterError(f'unknown setting(s) {", ".join(sorted(unknown))}')
    values = {s.name: read_setting(s, arguments.get(s.name), environ) for s in table}
    return settings_type(table, name)(**{**values, **adjusted})
