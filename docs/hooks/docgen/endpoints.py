"""The endpoints reference: each executor's endpoints (from Jina's own table) and the request parameters.

Endpoints come from `requests_by_class` (what `@requests` bound) and the `_bind_model_endpoints(...)` calls
of each executor's constructor (the `/<endpoint>/<model>` routes). The parameters' descriptions live in
PARAMETERS below; which parameters exist is read from the code (`parameters.get('x')`, `parameters['x']`,
`'x' in parameters`, `X_PARAMETER = 'x'` in serving/ and config/), and the tests fail when the two differ.
"""

from __future__ import annotations

import ast
import inspect
import re

from docgen.markdown import page, table
from docgen.settings import ROOT

ENCODE = '`/encode`, `/encode/<model>`, every unbound path'
# name -> (endpoints, type, default, description)
PARAMETERS = {
    'access_paths': (
        ENCODE,
        'str',
        "the executor's `access_paths` (`@r`)",
        'DocArray selector of the documents to encode: `@r` the roots, `@c` their chunks, `@r,c` both.',
    ),
    'traversal_paths': (
        ENCODE,
        'str',
        '-',
        "clip-as-service's name for `access_paths` (deprecated, logged); it wins when both are sent, as there.",
    ),
    'drop_image_content': (
        f'{ENCODE}, `/rank`',
        'bool',
        '`false` (clip-client sends `true`)',
        'Remove image bytes and tensors from the answer (they are sent back otherwise).',
    ),
    'allow_empty_matches': (
        '`/rank`',
        'bool',
        '`false`',
        'Pass a query without matches through unchanged instead of failing the request.',
    ),
    'reuse_embeddings': (
        '`/rank`',
        'bool',
        '`false` on CLIPEncoder, `true` on CLIPRanker',
        'Keep the embeddings documents already carry (matches from an indexer) instead of encoding them again.',
    ),
    'token_counts': (
        f'{ENCODE}, `/rank`',
        'bool',
        '`false`',
        "Write each text's token count into its tags "
        "(`clipserve_tokens`); the gateway's `/v1` routes ask for it to report `usage`.",
    ),
    'timeout_seconds': (
        f'{ENCODE}, `/rank`',
        'number > 0',
        "the executor's `max_request_seconds`",
        'The '
        "request's deadline: work still queued past it is dropped and the request fails (504 on "
        'HTTP). The gateway sets it from `X-Request-Timeout` on the `/v1` routes.',
    ),
    'multi_vector': (
        f'{ENCODE} (late-interaction models)',
        'bool',
        '`false`',
        "A late-interaction model (ColPali, ColQwen2) answers an encode with each document's [tokens, dim] "
        'embedding only when the request sets this (clip-client cannot stack them); single-vector models ignore it.',
    ),
    'pool_factor': (
        f'{ENCODE} (late-interaction models)',
        'int >= 1',
        "the executor's `pool_factor` (1: off)",
        "Pool each page's vectors `factor` to one (hierarchical clustering) before they are returned; queries "
        '(texts) are never pooled, and `/rank` scores unpooled pages.',
    ),
    'top_n': (
        '`/rerank` (CrossEncoderRanker)',
        'int >= 1',
        'every match',
        'Keep the best n matches of each query after scoring.',
    ),
    'max_length': (
        '`/rerank` (CrossEncoderRanker)',
        'int >= 4',
        "the reranker's `max_length`, else the model's",
        'Tokens of a (query, match) pair, special tokens included; longer pairs are cut (or refused, `truncate`).',
    ),
    'truncation_direction': (
        '`/rerank` (CrossEncoderRanker)',
        '`right`, `left`',
        '`right`',
        'Which end of a pair too long is cut (longest of query and match first, as transformers does).',
    ),
    'truncate': (
        '`/rerank` (CrossEncoderRanker)',
        'bool',
        '`true`',
        'false: a pair longer than max_length fails the request, naming the match, instead of being cut.',
    ),
    'limit': (
        '`/search` (CLIPIndexer)',
        'int 1-10,000',
        "the indexer's `limit` (10)",
        "Matches per query document (clip-client's `search(..., limit=)`).",
    ),
    'filter': (
        '`/search` (CLIPIndexer)',
        'object',
        'none',
        'Only documents whose tags pass it: AnnLite\'s syntax (`{"tag": {"$eq": v}}`, `$ne`, `$in`, `$nin`, '
        "`$gt`, `$gte`, `$lt`, `$lte`, `$and`, `$or`) or Qdrant's own filter ([Search](../search.md)).",
    ),
    'include_metadata': (
        '`/search` (CLIPIndexer)',
        'bool',
        "the indexer's `include_metadata` (`true`)",
        "Matches carry the indexed documents' text, URI and tags (else ids and scores only).",
    ),
    'ef_search': (
        '`/search` (CLIPIndexer)',
        'int >= 1',
        "the indexer's `ef_search` (128)",
        'HNSW candidates for this search: more is better recall and slower.',
    ),
    'ids': ('`/delete` (CLIPIndexer)', 'list of str', 'none', "Ids to delete besides the request's documents'."),
    'raise_errors_on_not_found': (
        '`/update` (CLIPIndexer)',
        'bool',
        '`false`',
        'Fail the request naming the documents that are not in the index (else they are skipped).',
    ),
}
# not read by the server: clip-client and clipserve_client.jina turn it into the endpoint
CLIENT_PARAMETERS = {
    'model_name': (
        '`/encode`, `/rank`',
        'str',
        "the Flow's default model",
        'clip-client sends the request to '
        '`/encode/<model_name>` or `/rank/<model_name>`: the executor serving that model answers.',
    ),
}
READS = (
    re.compile(r"parameters\)?\.get\(\s*'(\w+)'"),
    re.compile(r"parameters or \{\}\)\.get\(\s*'(\w+)'"),
    re.compile(r"parameters\[\s*'(\w+)'\s*\]"),
    re.compile(r"'(\w+)' in parameters\b"),
    re.compile(r"^\w+_PARAMETER = '(\w+)'", re.MULTILINE),
)


def parameters_in_code() -> dict[str, set[str]]:
    """Request parameter -> the files that read it."""
    found: dict[str, set[str]] = {}
    package = ROOT / 'executors' / 'clipserve'
    for path in [*(package / 'serving').rglob('*.py'), *(package / 'config').glob('*.py')]:
        text = path.read_text(encoding='utf-8')
        for pattern in READS:
            for name in pattern.findall(text):
                if not name.startswith('__'):
                    found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def _model_routes(cls) -> list[str]:
    """The endpoints a class's constructor binds per model (`self._bind_model_endpoints('/encode', ...)`)."""
    tree = ast.parse(inspect.getsource(cls.__init__).strip())
    routes = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, 'attr', '') == '_bind_model_endpoints':
            routes += [f'{a.value}/<model>' for a in node.args if isinstance(a, ast.Constant)]
    return routes


def endpoint_rows() -> list[tuple[str, str, str, str]]:
    """(executor, endpoint, handler, what it does) from Jina's table of each executor."""
    from clipserve import CLIPEncoder, CLIPIndexer, CLIPRanker, CrossEncoderRanker

    rows = []
    for cls in (CLIPEncoder, CLIPRanker, CLIPIndexer, CrossEncoderRanker):
        table_ = cls.requests_by_class.get(cls.__name__, {})
        for endpoint, handler in table_.items():
            fn = getattr(handler, 'fn', handler)
            doc = inspect.getdoc(fn) or inspect.getdoc(cls) or ''
            shown = 'every other path (`/`, `/index`, `/search`, ...)' if endpoint == '/default' else f'`{endpoint}`'
            rows.append((cls.__name__, shown, fn.__name__, doc.split('\n\n')[0].replace('\n', ' ')))
        for route in _model_routes(cls) if cls in (CLIPEncoder, CLIPRanker) else ():
            rows.append(
                (
                    cls.__name__,
                    f'`{route}`',
                    '-',
                    f'as `{route.split("/<")[0]}`, for the executor serving '
                    '`<model>` (another model of the Flow passes it through)',
                )
            )
    return rows


def endpoints_page() -> str:
    parts = [
        '## Endpoints\n',
        "What each executor answers (Jina's endpoint table). Every endpoint takes a DocumentArray and answers "
        'with the same documents, filled in.\n',
        table(('executor', 'endpoint', 'handler', 'what'), endpoint_rows()),
        '## Request parameters\n',
        'Sent as `parameters={...}` (clip-client, Jina\'s Client) or `"parameters": {...}` (HTTP `/post`). '
        'Parameters reach every executor of a Flow, so unknown ones are ignored; a known one with a wrong type '
        'fails the request with an error naming it.\n',
        table(
            ('parameter', 'endpoints', 'type', 'default', 'description'),
            [(f'`{name}`', *row) for name, row in {**PARAMETERS, **CLIENT_PARAMETERS}.items()],
        ),
        '```python\nfrom jina import Client\n\n'
        "Client(port=51000).post('/encode', docs, parameters={'access_paths': '@r,c', 'drop_image_content': True})\n"
        '```\n',
    ]
    return page(
        'Endpoints and request parameters', 'requests_by_class of CLIPEncoder, CLIPRanker and CLIPIndexer', *parts
    )
