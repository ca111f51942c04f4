"""Every setting of the indexer (CLIPIndexer), once: name, type, default, variable, description.

Read as the executor's settings are (settings.py: the argument, else the variable, else the default). The
names of clip-as-service's indexer (AnnLite's `n_dim`, `metric`, `limit`, `ef_construction`, `ef_search`,
`max_connection`, `columns`, `include_metadata`) are kept, so a search Flow's YAML needs only its `uses:`
changed; AnnLite's other spellings (`dim`, `ef_query`, `index_traversal_paths`, `search_traversal_paths`)
are read too.
"""

from __future__ import annotations

import dataclasses

from clipserve.config.parameters import check_access_paths, env_or_default
from clipserve.config.reading import Setting, read_settings

METRIC_NAMES = ('cosine', 'euclidean', 'inner_product')
QUANTIZATIONS = ('none', 'int8')
#: AnnLite's other spellings -> the setting they set
ALIASES = {
    'dim': 'n_dim',
    'ef_query': 'ef_search',
    'index_traversal_paths': 'access_paths',
    'search_traversal_paths': 'access_paths',
    'traversal_paths': 'access_paths',
}
#: AnnLite's arguments that have no meaning here: accepted, and named in a warning
IGNORED = ('n_components', 'serialize_config', 'data_path', 'n_cells', 'n_subvectors', 'n_probe', 'initial_size')


def _s(name, kind, default, description, **extra) -> Setting:
    return Setting(name, kind, default, description, section=extra.pop('section', 'index'), **extra)


INDEXER_SETTINGS: tuple[Setting, ...] = (
    _s(
        'index_path',
        'str',
        None,
        "The embedded index's folder; unset: `clipserve-index` in the executor's workspace. A shard of a sharded "
        'indexer adds `shard-<id>` to it.',
    ),
    _s(
        'qdrant_url',
        'str',
        None,
        'A Qdrant server or cluster (`http://host:6333`) to keep the collection in, instead of the embedded index.',
    ),
    _s('qdrant_collection', 'str', 'clipserve', "The collection's name on the Qdrant server (`qdrant_url`)."),
    _s('qdrant_api_key', 'str', None, "The Qdrant server's API key, if it has one."),
    _s(
        'n_dim',
        'int',
        None,
        "The embeddings' size; unset: the first indexed documents' (a page of vectors makes a MaxSim index).",
        minimum=1,
    ),
    _s('metric', 'choice', 'cosine', "How vectors are compared (AnnLite's names).", choices=METRIC_NAMES),
    _s('limit', 'int', 10, 'Matches per query when a search names no `limit`.', minimum=1),
    _s('max_connection', 'int', 16, "HNSW graph edges per vector (Qdrant's `m`).", minimum=2),
    _s(
        'ef_construction',
        'int',
        200,
        'HNSW candidates while building the graph (more: better recall, slower).',
        minimum=4,
    ),
    _s(
        'ef_search',
        'int',
        128,
        'HNSW candidates while searching (more: better recall, slower); a search may send its own `ef_search`.',
        minimum=1,
    ),
    _s(
        'quantization',
        'choice',
        'none',
        '`int8`: vectors also kept as int8 for searching (a quarter of the memory), rescored with the originals.',
        choices=QUANTIZATIONS,
    ),
    _s(
        'columns',
        'columns',
        (),
        'Tags searches filter on, as `[[name, type], ...]` (type `str`, `int`, `float`, `bool`): each gets a '
        'payload index. Any tag can be filtered on without one.',
    ),
    _s(
        'include_metadata',
        'bool',
        True,
        "Matches carry the indexed documents' text, URI and tags (else only ids and scores).",
    ),
    _s('access_paths', 'str', '@r', 'DocArray selector of the documents to index and to search with.'),
    _s(
        'optimize_after',
        'int',
        20_000,
        'Unindexed vectors that make the embedded index build its search graph (in its own process, when no '
        'call has come for a second); fewer are searched exhaustively.',
        minimum=1,
    ),
    _s(
        'max_stored_uri_bytes',
        'int',
        65_536,
        'Longest URI kept with a document (a data: URI is the image itself); longer ones are not stored.',
        minimum=0,
    ),
)


def indexer_settings(environ=None, **arguments):
    """The indexer's settings, checked; AnnLite's other spellings set theirs (the last given wins)."""
    warnings = [
        f'"{name}" (an AnnLite argument) is ignored' for name in IGNORED if arguments.pop(name, None) is not None
    ]
    for old, new in ALIASES.items():
        value = env_or_default(arguments.pop(old, None), None)
        if value is not None:
            arguments.setdefault(new, value)
            if old not in ('dim', 'index_traversal_paths', 'search_traversal_paths', 'ef_query'):
                warnings.append(f'"{old}" is deprecated; use "{new}"')
    values = read_settings(INDEXER_SETTINGS, arguments, environ, 'IndexerSettings', warnings=tuple(warnings))
    return dataclasses.replace(values, access_paths=check_access_paths('access_paths', values.access_paths))
