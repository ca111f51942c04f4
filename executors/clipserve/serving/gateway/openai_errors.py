"""What an unknown model and an executor's failed documents become on the OpenAI-compatible routes: one APIError
naming every failed item by its position in the request, 413 for a size cap, 400 otherwise."""

from __future__ import annotations

import re

from clipserve.serving.gateway.api_error import APIError, ItemError, bad_request


def unknown_model(model: str, served: list[str]) -> APIError:
    return APIError(
        404,
        f'The model {model!r} does not exist on this server; served models: {", ".join(served)}',
        'model',
        'model_not_found',
    )


# Until the encoder marks each failure with its kind ([doc id, reason, code]), a failure without a code is
# classed by the size caps' messages (inputs/uris.py, serving/replica/documents.py, models/preprocess.py).
_SIZE_LIMIT = re.compile(
    r'larger than the limit of \d+ bytes|over the limit of \d+ (bytes|pixels)|^image too large', re.IGNORECASE
)
TOO_LARGE_CODES = ('payload_too_large', 'too_large')


def is_size_limit(reason: str) -> bool:
    return bool(_SIZE_LIMIT.search(reason))


def failures_error(failures, params: dict[str, str]) -> APIError:
    """One error naming every failed item by its request position (`params`: document id -> `input[i]`), from
    the failures an InvalidDocumentError carries ([doc id, reason] or [doc id, reason, code]). A size cap
    makes it a 413, anything else a 400; the first failure is the `param`; `items` carries each one."""
    items, too_large = [], False
    for failure in failures:
        doc_id, reason, code = (list(failure) + [None])[:3]
        big = code in TOO_LARGE_CODES if code else is_size_limit(str(reason))
        code = code or ('too_large' if big else 'invalid_input')
        items.append(ItemError(params.get(str(doc_id), str(doc_id)), str(reason), code))
        too_large |= big
    if not items:
        return bad_request('the request could not be encoded', None, 'invalid_input')
    text = '; '.join(f'{item.param}: {item.message}' for item in items)
    code = 'too_large' if too_large else 'invalid_input'
    return APIError(413 if too_large else 400, text, items[0].param, code, items=tuple(items))
