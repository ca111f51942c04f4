"""OpenAI's embeddings API, a rank route in the style of the rerank APIs, and a model list: the requests, as data.

What the gateway's `/v1/*` routes (openai_routes.py, flow_calls.py) need that is not about Jina: the
request body parsed within bounds (bytes by the gateway's max_body_bytes, JSON values counted before they
are built) into a list of text and image items (errors naming the bad item's index), OpenAI's error object,
and the encoder's errors mapped by their kind (errors.py), per-document failures named by the request's
items. The answers' shapes are openai_answers.py's. No Jina, no DocArray, no sockets.

Inputs (`input` of /v1/embeddings, `query` and `documents` of /v1/rank):

- a string is an image when it is a `data:image/...` URI or an http(s) URL (fetched by the encoder only
  where the operator allows remote URIs; elsewhere refused, never fetched), otherwise a text;
- `{"text": ...}` and `{"image": ...}` (NV-CLIP's and Jina's items), `{"type": "text", "text": ...}` and
  `{"type": "image_url", "image_url": {"url": ...}}` (OpenAI's content parts) say which explicitly; an
  explicit image may also be bare base64 image bytes;
- Infinity's top-level `modality` ("text" or "image") says it for every string of the request.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass

from clipserve.config.gateway_settings import MAX_INPUTS
from clipserve.inputs.uris import UriError, decode_data_uri
from clipserve.serving.gateway.api_error import APIError, bad_request, item_error, items_error

MODELS_PATH = '/v1/models'
EMBEDDINGS_PATH = '/v1/embeddings'
RANK_PATH = '/v1/rank'
PLAYGROUND_PATH = '/playground'
SEARCH_PATH = '/v1/search'
RERANK_PATHS = ('/v1/rerank', '/rerank', '/v2/rerank')  # Cohere's, Jina's, Infinity's, TEI's and vLLM's
ROUTES = {MODELS_PATH: 'GET', EMBEDDINGS_PATH: 'POST', RANK_PATH: 'POST', SEARCH_PATH: 'POST'}
ROUTES.update({path: 'POST' for path in RERANK_PATHS})
ENCODING_FORMATS = ('float', 'base64')
MODALITIES = ('text', 'image')
TEXT, IMAGE = 'text', 'image'
#: what an image counts in `usage` (CLIP models see no image tokens a client could count; texts count
#: the tokens of the model's own tokenizer, start and end tokens included, after truncation)
IMAGE_TOKENS = 0


def is_api_path(path: str | None) -> bool:
    """The gateway's own JSON API: /v1/*, and the rerank paths clients call outside /v1."""
    return bool(path) and (path == '/v1' or path.startswith('/v1/') or path in RERANK_PATHS)


# ---- items --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    """One text or image of a request. An image is either its bytes (from a data: URI or base64) or an
    http(s) URL, which the encoder fetches under the operator's URI policy."""

    modality: str  # TEXT or IMAGE
    text: str = ''
    image: bytes = b''
    url: str = ''


def _is_data_image(value: str) -> bool:
    return value[:11].lower() == 'data:image/'


def _is_url(value: str) -> bool:
    return value[:8].lower() == 'https://' or value[:7].lower() == 'http://'


def _text(value, param: str) -> Item:
    if not isinstance(value, str):
        raise item_error(param, f'a text must be a string, got {type(value).__name__}')
    if not value.strip():
        raise item_error(param, 'empty text (send at least one non-blank character)')
    return Item(TEXT, text=value)


def _image(value, param: str, max_bytes: int, bare_base64: bool = True) -> Item:
    """An image given as a data: URI, an http(s) URL or (where explicit) base64 of the image file."""
    if not isinstance(value, str):
        raise item_error(
            param, f'an image must be a string (data: URI, http(s) URL or base64), got {type(value).__name__}'
        )
    value = value.strip()
    if _is_url(value):
        return Item(IMAGE, url=value)
    if value[:5].lower() == 'data:':
        if len(value) - value.find(',') - 1 > max_bytes * 4 // 3 + 4:
            raise _too_large(param, f'the data: URI is larger than the limit of {max_bytes} bytes')
        try:
            data = decode_data_uri(value, max_bytes)
        except UriError as e:
            raise item_error(param, str(e), code='invalid_image') from None
    elif bare_base64 and value:
        if len(value) > max_bytes * 4 // 3 + 4:
            raise _too_large(param, f'the base64 image is larger than the limit of {max_bytes} bytes')
        try:
            data = base64.b64decode(value.replace('\n', '').replace('\r', ''), validate=True)
        except (binascii.Error, ValueError):
            raise item_error(
                param, 'not an image: send a data: URI, an http(s) URL or base64 of the image file'
            ) from None
    else:
        raise item_error(param, 'not an image: send a data: URI or an http(s) URL')
    if not data:
        raise item_error(param, 'empty image data')
    return Item(IMAGE, image=data)


def _too_large(param: str, reason: str) -> APIError:
    return item_error(param, reason, 413, 'too_large')


def parse_item(value, param: str, modality: str | None = None, max_image_bytes: int = 1 << 62) -> Item:
    """One input: a string (an image by its form or by `modality`, else a text) or an item object."""
    if isinstance(value, str):
        if modality == TEXT:
            return _text(value, param)
        if modality == IMAGE:
            return _image(value, param, max_image_bytes)
        stripped = value.strip()
        if _is_data_image(stripped) or _is_url(stripped):
            return _image(stripped, param, max_image_bytes, bare_base64=False)
        return _text(value, param)
    if isinstance(value, dict):
        kind = value.get('type')
        if kind is not None:
            if kind == 'text' and 'text' in value:
                return _text(value['text'], f'{param}.text')
            if kind == 'image_url' and 'image_url' in value:
                url = value['image_url']
                url = url.get('url') if isinstance(url, dict) else url
                return _image(url, f'{param}.image_url', max_image_bytes)
            if kind == 'image' and 'image' in value:
                return _image(value['image'], f'{param}.image', max_image_bytes)
            raise item_error(
                param,
                f'an item of type {kind!r} must be {{"type": "text", "text": ...}} or '
                '{"type": "image_url", "image_url": {"url": ...}}',
            )
        keys = [k for k in ('text', 'image') if k in value]
        if len(keys) != 1:
            raise item_error(param, 'an item object must have exactly one of "text" or "image"')
        if keys[0] == 'text':
            return _text(value['text'], f'{param}.text')
        return _image(value['image'], f'{param}.image', max_image_bytes)
    if isinstance(value, (int, list)) and not isinstance(value, bool):
        raise item_error(
            param,
            "token id arrays are not supported (they are ids of OpenAI's tokenizer, which a CLIP model "
            'does not use): send the text itself',
            code='unsupported_input',
        )
    raise item_error(
        param, f'expected a string or an object {{"text": ...}} / {{"image": ...}}, got {type(value).__name__}'
    )


def parse_items(
    value,
    param: str = 'input',
    modality: str | None = None,
    max_items: int = MAX_INPUTS,
    max_image_bytes: int = 1 << 62,
) -> list[Item]:
    """`input`: one item or a list of them. Errors name the item, e.g. param `input[3]`."""
    if value is None:
        raise bad_request(f"'{param}' is required: a string or a list of strings or items", param, 'missing')
    if modality is not None and modality not in MODALITIES:
        raise bad_request(
            f'modality must be one of {", ".join(MODALITIES)} (or left out), got {modality!r}', 'modality'
        )
    if not isinstance(value, list):
        return [parse_item(value, param, modality, max_image_bytes)]
    if not value:
        raise bad_request(f"'{param}' is an empty list: send at least one text or image", param)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        parse_item(value, param)  # raises: a list of ints is one tokenized input
    if len(value) > max_items:
        raise bad_request(
            f"'{param}' has {len(value)} items; at most {max_items} per request (the gateway's max_inputs)",
            param,
            'too_many_items',
        )
    items, failed = [], []
    for i, v in enumerate(value):  # every bad item named in one error, not only the first
        try:
            items.append(parse_item(v, f'{param}[{i}]', modality, max_image_bytes))
        except APIError as error:
            failed.append(error)
    if failed:
        raise items_error(failed)
    return items


# ---- requests -----------------------------------------------------------------------------------


def _model(body: dict) -> str | None:
    model = body.get('model')
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise bad_request(f"'model' must be a model name (a string), got {model!r}", 'model')
    return model.strip() if model else None


def _modality(body: dict) -> str | None:
    modality = body.get('modality')
    if modality is None:
        return None
    if modality not in MODALITIES:
        raise bad_request(
            f"'modality' must be one of {', '.join(MODALITIES)} (or left out), got {modality!r}", 'modality'
        )
    return modality


def _object(body) -> dict:
    if not isinstance(body, dict):
        raise bad_request('the request body must be a JSON object', None, 'invalid_json')
    return body


@dataclass(frozen=True)
class EmbeddingsRequest:
    items: list[Item]
    model: str | None  # None: the Flow's default model
    encoding_format: str = 'float'
    dimensions: int | None = None
    return_multivector: bool = False  # late-interaction models: [tokens, dim] per input, asked for explicitly


def parse_embeddings_request(body, max_image_bytes: int = 1 << 62, max_inputs: int = MAX_INPUTS) -> EmbeddingsRequest:
    """The body of POST /v1/embeddings. `user` is accepted and ignored; other unknown fields are ignored."""
    body = _object(body)
    encoding_format = body.get('encoding_format') or 'float'
    if encoding_format not in ENCODING_FORMATS:
        raise bad_request(
            f"'encoding_format' must be one of {', '.join(ENCODING_FORMATS)}, got {encoding_format!r}",
            'encoding_format',
        )
    dimensions = body.get('dimensions')
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)):
        raise bad_request(f"'dimensions' must be an integer, got {dimensions!r}", 'dimensions')
    multivector = body.get('return_multivector', False)
    if not isinstance(multivector, bool):
        raise bad_request(f"'return_multivector' must be true or false, got {multivector!r}", 'return_multivector')
    model = _model(body)
    items = parse_items(body.get('input'), 'input', _modality(body), max_inputs, max_image_bytes)
    return EmbeddingsRequest(
        items=items,
        model=model,
        encoding_format=encoding_format,
        dimensions=dimensions,
        return_multivector=multivector,
    )


def check_multivector(asked: bool, model: str, late_interaction: bool) -> None:
    """A late-interaction model answers with [tokens, dim] per input, which an OpenAI client reading one vector
    would mistake: it is served only when asked for (`return_multivector`), and only by such a model."""
    if asked and not late_interaction:
        raise bad_request(
            f"'return_multivector' is for late-interaction models (ColPali, ColQwen2); {model} gives one vector "
            'per input',
            'return_multivector',
        )
    if late_interaction and not asked:
        raise bad_request(
            f'{model} is a late-interaction model: it gives one vector per token ([tokens, dim] per input), not '
            "one per input; send 'return_multivector': true to receive them",
            'return_multivector',
        )


def check_dimensions(dimensions: int | None, model: str, embed_dim: int) -> None:
    """`dimensions` other than the model's own size is refused: CLIP embeddings are not trained to be cut."""
    if dimensions is None or dimensions == embed_dim:
        return
    raise bad_request(
        f"'dimensions' is not supported: {model} gives {embed_dim}-dimensional embeddings, and CLIP embeddings "
        'are not trained to be truncated (the first dimensions of a CLIP embedding are not a smaller embedding); '
        'leave it out',
        'dimensions',
        'unsupported_parameter',
    )


@dataclass(frozen=True)
class RankRequest:
    query: Item
    documents: list[Item]
    model: str | None
    top_n: int | None = None


def parse_rank_request(body, max_image_bytes: int = 1 << 62, max_inputs: int = MAX_INPUTS) -> RankRequest:
    """The body of POST /v1/rank: `query` (one item), `documents` (alias `candidates`: a list), `top_n`."""
    body = _object(body)
    modality = _modality(body)
    model = _model(body)
    if body.get('query') is None:
        raise bad_request("'query' is required: a text or an image", 'query', 'missing')
    if isinstance(body.get('query'), list):
        raise bad_request("'query' must be one text or image, not a list", 'query')
    query = parse_item(body['query'], 'query', modality, max_image_bytes)
    name = 'documents' if 'documents' in body or 'candidates' not in body else 'candidates'
    documents = body.get(name)
    if documents is not None and not isinstance(documents, list):
        raise bad_request(f"'{name}' must be a list of texts or images", name)
    items = parse_items(documents, name, modality, max_inputs, max_image_bytes)
    top_n = body.get('top_n')
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise bad_request(f"'top_n' must be an integer >= 1, got {top_n!r}", 'top_n')
    return RankRequest(query=query, documents=items, model=model, top_n=top_n)


# ---- the body ------------------------------------------------------------------------------------

# a JSON string (what it holds cannot be structure); unrolled, so it scans in linear time
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def _structure(raw: bytes, start: int = 0, end: int | None = None) -> int:
    end = len(raw) if end is None else end
    return raw.count(b',', start, end) + raw.count(b'[', start, end) + raw.count(b'{', start, end)


def too_many_values(raw: bytes, most: int) -> bool:
    """Whether a JSON document holds more than `most` values, told without parsing it: each container holds
    at most one more value than it has commas, so values <= commas + containers + 1 outside strings; and a
    document with more strings than that is too many whatever its structure. Linear, nothing copied."""
    structure = _structure(raw) + 1
    if structure <= most:
        return False
    if (raw.count(b'"') - raw.count(b'\\"')) // 2 > most:  # at least that many strings
        return True
    inside = sum(_structure(raw, m.start(), m.end()) for m in _STRING.finditer(raw))  # texts' commas
    return structure - inside > most


def parse_body(raw: bytes, max_inputs: int = MAX_INPUTS):
    """The JSON of a request body, refused before it is built when it holds more values than `max_inputs`
    items could (8 values an item is more than any item form takes): a body of a million empty items is a
    million Python objects, however few bytes it is."""
    most = 8 * max_inputs + 64
    if too_many_values(raw, most):
        raise bad_request(
            f'the request holds more than {most} JSON values; at most {max_inputs} inputs per request '
            "(the gateway's max_inputs)",
            None,
            'too_many_items',
        )
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f'the request body is not valid JSON: {e}', None, 'invalid_json') from None
    except RecursionError:
        raise bad_request('the request body is nested too deeply', None, 'invalid_json') from None
