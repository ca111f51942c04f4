"""Validation of constructor arguments and per-request parameters.

Parameters reach every executor of a Flow, so unknown keys are ignored; a known key with a wrong
type or value is an InvalidParameterError naming the key and what it accepts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clipserve import environment
from clipserve.errors import InvalidParameterError

# jina leaves `${{ ENV.X }}` as the literal `$X` when X is unset.
_UNSET_ENV = re.compile(r'^\$[A-Za-z_][A-Za-z0-9_]*$')


def env_or_default(value, default):
    """`value`, unless it is empty or an unexpanded environment variable from a Flow YAML."""
    if value is None or (isinstance(value, str) and (not value.strip() or _UNSET_ENV.match(value.strip()))):
        return default
    return value


def check_bool(key: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ('true', 'false'):
        return value.lower() == 'true'
    raise InvalidParameterError(f'parameter {key!r} must be a boolean (true or false), got {value!r}')


def check_int(key: str, value, minimum: int = 1) -> int:
    # protobuf Structs carry numbers as floats, so 8.0 is a fine 8.
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidParameterError(f'parameter {key!r} must be an integer >= {minimum}, got {value!r}')
    try:
        number = float(value)
    except ValueError:
        raise InvalidParameterError(f'parameter {key!r} must be an integer >= {minimum}, got {value!r}') from None
    if not number.is_integer() or number < minimum:
        raise InvalidParameterError(f'parameter {key!r} must be an integer >= {minimum}, got {value!r}')
    return int(number)


def check_access_paths(key: str, value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidParameterError(
            f'parameter {key!r} must be a DocArray selector string such as "@r", "@c" or "@r,c", got {value!r}'
        )
    return value.strip()


# a Flow's token: the gateway requires it, `clipserve serve --token` sets it, `embed --server` and the clients send it
TOKEN_ENV = environment.AUTH_TOKEN.name

# Request parameter: write each text document's token count into its tags (the gateway's OpenAI-style
# routes ask for it to report `usage`); the tag's name is endpoints.TOKEN_COUNT_TAG.
TOKEN_COUNTS_PARAMETER = 'token_counts'
# The public name of late interaction ([tokens, dim] per input): the request parameter a late-interaction
# model's encode must carry (serving/replica/late_interaction.py), and the field that marks such a model in a
# replica's /clipserve/info and the gateway's /v1/models.
MULTI_VECTOR_PARAMETER = 'multi_vector'


@dataclass(frozen=True)
class RequestOptions:
    access_paths: str
    drop_image_content: bool
    allow_empty_matches: bool = False
    token_counts: bool = False


def request_options(parameters: dict | None, default_access_paths: str, logger=None) -> RequestOptions:
    """Read the per-request parameters this executor understands."""
    parameters = dict(parameters or {})
    access_paths = default_access_paths
    if 'access_paths' in parameters:
        access_paths = check_access_paths('access_paths', parameters['access_paths'])
    if 'traversal_paths' in parameters:  # the legacy name wins, as in clip-as-service
        access_paths = check_access_paths('traversal_paths', parameters['traversal_paths'])
        if logger:
            logger.warning('the parameter "traversal_paths" is deprecated; use "access_paths"')
    drop = check_bool('drop_image_content', parameters.get('drop_image_content', False))
    allow_empty = check_bool('allow_empty_matches', parameters.get('allow_empty_matches', False))
    counts = check_bool(TOKEN_COUNTS_PARAMETER, parameters.get(TOKEN_COUNTS_PARAMETER, False))
    return RequestOptions(
        access_paths=access_paths, drop_image_content=drop, allow_empty_matches=allow_empty, token_counts=counts
    )


def check_number(key: str, value, minimum: float = 0.0) -> float:
    """A finite number > `minimum` (protobuf carries numbers as floats; YAML and headers as strings)."""
    import math

    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number) or number <= minimum:
        raise InvalidParameterError(f'parameter {key!r} must be a number > {minimum:g}, got {value!r}')
    return number
