"""OpenAI's embeddings API, a rank route in the style of the rerank APIs, and a model list, as plain data.

What the gateway's `/v1/*` routes (openai_gateway.py) need that is not about Jina: the request body
read into a list of text and image items (errors naming the bad item's index), the answers built in
OpenAI's shapes (base64 as OpenAI's SDK decodes it: little-endian float32), `usage`, OpenAI's error
object, and the encoder's per-document failures turned back into errors that name the request's items.
No Jina, no DocArray, no sockets: everything here is tested on plain values.

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
import math
import re
from dataclasses import dataclass

import numpy as np

from clipserve.uris import UriError, decode_data_uri

MAX_INPUTS = 2048  # items per request, as OpenAI's embeddings API allows
ENCODING_FORMATS = ('float', 'base64')
MODALITIES = ('text', 'image')
TEXT, IMAGE = 'text', 'image'
#: what an image counts in `usage` (CLIP models see no image tokens a client could count; texts count
#: the tokens of the model's own tokenizer, start and end tokens included, after truncation)
IMAGE_TOKENS = 0


class APIError(Exception):
    """An answer in OpenAI's error shape: {"error": {"message", "type", "param", "code"}} with an HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    @property
    def type(self) -> str:
        if self.status == 401:
            return 'invalid_request_error'  # as OpenAI answers a wrong key
        return 'server_error' if self.status >= 500 else 'invalid_request_error'

    def body(self) -> dict:
        return {'error': {'message': self.message, 'type': self.type, 'param': self.param, 'code': self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = 'invalid_value') -> APIError:
    return APIError(400, message, param, code)


AUTH_ERROR = APIError(
    401,
    'missing or wrong token: send it as the API key (header "Authorization: Bearer <token>")',
    code='invalid_api_key',
)


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
        raise bad_request(f'{param}: a text must be a string, got {type(value).__name__}', param)
    if not value.strip():
        raise bad_request(f'{param}: empty text (send at least one non-blank character)', param)
    return Item(TEXT, text=value)


def _image(value, param: str, max_bytes: int, bare_base64: bool = True) -> Item:
    """An image given as a data: URI, an http(s) URL or (where explicit) base64 of the image file."""
    if not isinstance(value, str):
        raise bad_request(
            f'{param}: an image must be a string (data: URI, http(s) URL or base64), got {type(value).__name__}', param
        )
    value = value.strip()
    if _is_url(value):
        return Item(IMAGE, url=value)
    if value[:5].lower() == 'data:':
        try:
            data = decode_data_uri(value, max_bytes)
        except UriError as e:
            raise _image_error(param, str(e)) from None
    elif bare_base64 and value:
        if len(value) > max_bytes * 4 // 3 + 4:
            raise _image_error(param, f'the base64 image is larger than the limit of {max_bytes} bytes')
        try:
            data = base64.b64decode(value.replace('\n', '').replace('\r', ''), validate=True)
        except (binascii.Error, ValueError):
            raise bad_request(
                f'{param}: not an image: send a data: URI, an http(s) URL or base64 of the image file', param
            ) from None
    else:
        raise bad_request(f'{param}: not an image: send a data: URI or an http(s) URL', param)
    if not data:
        raise bad_request(f'{param}: empty image data', param)
    return Item(IMAGE, image=data)


def _image_error(param: str, reason: str) -> APIError:
    return APIError(
        413 if is_size_limit(reason) else 400,
        f'{param}: {reason}',
        param,
        'too_large' if is_size_limit(reason) else 'invalid_image',
    )


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
            raise bad_request(
                f'{param}: an item of type {kind!r} must be {{"type": "text", "text": ...}} or '
                '{"type": "image_url", "image_url": {"url": ...}}',
                param,
            )
        keys = [k for k in ('text', 'image') if k in value]
        if len(keys) != 1:
            raise bad_request(f'{param}: an item object must have exactly one of "text" or "image"', param)
        if keys[0] == 'text':
            return _text(value['text'], f'{param}.text')
        return _image(value['image'], f'{param}.image', max_image_bytes)
    if isinstance(value, (int, list)) and not isinstance(value, bool):
        raise bad_request(
            f"{param}: token id arrays are not supported (they are ids of OpenAI's tokenizer, which a CLIP model "
            'does not use): send the text itself',
            param,
            'unsupported_input',
        )
    raise bad_request(
        f'{param}: expected a string or an object {{"text": ...}} / {{"image": ...}}, got {type(value).__name__}', param
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
        raise bad_request(f"'{param}' has {len(value)} items; at most {max_items} per request", param, 'too_many_items')
    return [parse_item(v, f'{param}[{i}]', modality, max_image_bytes) for i, v in enumerate(value)]


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


def parse_embeddings_request(body, max_image_bytes: int = 1 << 62) -> EmbeddingsRequest:
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
    model = _model(body)
    items = parse_items(body.get('input'), 'input', _modality(body), max_image_bytes=max_image_bytes)
    return EmbeddingsRequest(items=items, model=model, encoding_format=encoding_format, dimensions=dimensions)


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


def parse_rank_request(body, max_image_bytes: int = 1 << 62) -> RankRequest:
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
    items = parse_items(documents, name, modality, max_image_bytes=max_image_bytes)
    top_n = body.get('top_n')
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise bad_request(f"'top_n' must be an integer >= 1, got {top_n!r}", 'top_n')
    return RankRequest(query=query, documents=items, model=model, top_n=top_n)


# ---- answers ------------------------------------------------------------------------------------


def l2_normalise(vectors) -> np.ndarray:
    """Rows scaled to unit length (as OpenAI's embeddings are), in float32; an all-zero row stays zero."""
    matrix = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(matrix, axis=-1, keepdims=True)
    return (matrix / np.where(norms > 0, norms, 1.0)).astype(np.float32)


def encode_base64(vector) -> str:
    """base64 of the little-endian float32 bytes: what OpenAI answers and its SDK decodes."""
    return base64.b64encode(np.asarray(vector, dtype='<f4').tobytes()).decode('ascii')


def decode_base64(data: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(data), dtype='<f4')


def usage(prompt_tokens: int) -> dict:
    return {'prompt_tokens': int(prompt_tokens), 'total_tokens': int(prompt_tokens)}


def embeddings_response(vectors, model: str, encoding_format: str, prompt_tokens: int) -> dict:
    """OpenAI's answer: {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], ...}."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if encoding_format == 'base64':
        rows = [encode_base64(v) for v in vectors]
    else:
        rows = vectors.tolist()
    return {
        'object': 'list',
        'data': [{'object': 'embedding', 'index': i, 'embedding': row} for i, row in enumerate(rows)],
        'model': model,
        'usage': usage(prompt_tokens),
    }


@dataclass(frozen=True)
class RankResult:
    index: int
    clip_score: float  # softmax of 100 x cosine over the request's documents, as /rank computes it
    clip_score_cosine: float
    siglip_score: float | None = None  # SigLIP models: the model's own match probability


def rank_response(results: list[RankResult], model: str, prompt_tokens: int, top_n: int | None = None) -> dict:
    """Results best first (the order /rank sorts them in), cut to `top_n`. `relevance_score` is
    `clip_score`, under the name rerank clients read."""
    rows = []
    for r in results[:top_n] if top_n else results:
        row = {
            'index': r.index,
            'relevance_score': r.clip_score,
            'clip_score': r.clip_score,
            'clip_score_cosine': r.clip_score_cosine,
        }
        if r.siglip_score is not None:
            row['siglip_score'] = r.siglip_score
        rows.append(row)
    return {'object': 'rerank', 'model': model, 'results': rows, 'usage': usage(prompt_tokens)}


@dataclass(frozen=True)
class ServedModel:
    """One model of the Flow, as its encoder reports it (`/clipserve/info`)."""

    name: str  # canonical: what /encode/<name> routes by
    embed_dim: int
    aliases: tuple[str, ...] = ()  # other names it answers to (as configured, e.g. ViT-B/32)
    default: bool = False  # answers requests that name no model
    modalities: tuple[str, ...] = MODALITIES


def models_response(models: list[ServedModel], created: int) -> dict:
    """GET /v1/models: OpenAI's list of model objects, with each model's embedding size and modalities."""
    return {
        'object': 'list',
        'data': [
            {
                'id': m.name,
                'object': 'model',
                'created': int(created),
                'owned_by': 'clipserve',
                'embedding_dimensions': m.embed_dim,
                'modalities': list(m.modalities),
                'aliases': list(m.aliases),
                'default': m.default,
            }
            for m in models
        ],
    }


def unknown_model(model: str, served: list[str]) -> APIError:
    return APIError(
        404,
        f'The model {model!r} does not exist on this server; served models: {", ".join(served)}',
        'model',
        'model_not_found',
    )


# ---- the encoder's failures as API errors -------------------------------------------------------

# The size caps' messages (uris.py, documents.py, models/preprocess.py): an image over max_image_bytes
# or max_image_pixels is a 413, any other bad image a 400.
_SIZE_LIMIT = re.compile(
    r'larger than the limit of \d+ bytes|over the limit of \d+ (bytes|pixels)|^image too large', re.IGNORECASE
)
_FAILURE = re.compile(r"document '(?P<id>[^']*)': (?P<reason>.*?)(?=; document '|; and \d+ more$|$)", re.DOTALL)


def is_size_limit(reason: str) -> bool:
    return bool(_SIZE_LIMIT.search(reason))


def parse_failures(message: str) -> list[tuple[str, str]]:
    """(document id, reason) from the message of an InvalidDocumentError (errors.py) as Jina relays it."""
    return [(m.group('id'), m.group('reason').strip()) for m in _FAILURE.finditer(message)]


def failures_error(failures: list[tuple[str, str]], params: dict[str, str]) -> APIError:
    """One error naming every failed item by its request position (`params`: document id -> `input[i]`).
    A size cap makes it a 413, anything else a 400; the first failure is the `param`."""
    named = [(params.get(doc_id, doc_id), reason) for doc_id, reason in failures]
    if not named:
        return bad_request('the request could not be encoded', None, 'invalid_input')
    too_large = any(is_size_limit(reason) for _, reason in named)
    text = '; '.join(f'{param}: {reason}' for param, reason in named)
    return APIError(413 if too_large else 400, text, named[0][0], 'too_large' if too_large else 'invalid_input')


def finite(value: float) -> float:
    """JSON has no NaN or infinity; a score that is not finite (it should never be) becomes 0."""
    return float(value) if math.isfinite(value) else 0.0
