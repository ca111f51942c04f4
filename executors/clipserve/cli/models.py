"""`clipserve models`: the models clipserve serves, from the catalogue's snapshot (no open_clip import, so it
answers at once): a table that fits 100 columns with the default marked, filtered by family or by any part of
the name, or every fact as JSON."""

from __future__ import annotations

import argparse
import json
import textwrap

from clipserve.models.known_models import rows
from clipserve.models.names import DEFAULT_MODEL, LEGACY_ALIASES

COLUMNS = (
    ('name', 'name'),
    ('family', 'family'),
    ('dim', 'embed_dim'),
    ('image', 'image_size'),
    ('text', 'context_length'),
)
MAX_WIDTH = 100


def add_parser(commands) -> None:
    p = commands.add_parser(
        'models',
        help='list the models (the default marked)',
        description="Every open_clip model and pretrained tag, clip-as-service's M-CLIP and CN-CLIP models,\n"
        'and the transformers model types, with their facts.',
        epilog='examples:\n  clipserve models --family siglip2\n  clipserve models vit-b-32\n'
        '  clipserve models --json | jq ".[0]"',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument('search', nargs='?', help='only names containing this text (case-insensitive)')
    p.add_argument('--family', help='only this family (e.g. SigLIP2, "MetaCLIP 2"), case-insensitive')
    p.add_argument('--json', action='store_true', help='every fact of each model, as one JSON list')
    p.add_argument('--all', action='store_true', help='also the models whose text side clipserve cannot serve')
    p.set_defaults(run=run)


def selected(args) -> list[dict]:
    found = [r for r in rows() if args.all or not r['backends'].startswith('none')]
    if args.family:
        found = [r for r in found if r['family'].lower() == args.family.lower()]
    if args.search:
        found = [r for r in found if args.search.lower() in r['name'].lower()]
    return found


def run(args) -> int:
    found = selected(args)
    if args.json:
        print(json.dumps(found, indent=1))
        return 0
    if not found:
        families = sorted({r['family'] for r in rows()})
        print(f'no model matches; the families: {", ".join(families)}')
        return 1
    table = [[title for title, _ in COLUMNS]] + [[_cell(r[key]) for _, key in COLUMNS] for r in found]
    sizes = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
    for i, row in enumerate(table):
        mark = '*' if i and found[i - 1]['name'] == DEFAULT_MODEL else ' '
        print((mark + ' ' + '  '.join(cell.ljust(size) for cell, size in zip(row, sizes))).rstrip())
    notes = (
        f'{len(found)} models; * the default. Any architecture also takes ::random (seeded random weights, no '
        'download), a weights file (arch::/path/weights.safetensors) or an open_clip folder (local-dir:/path); '
        'transformers checkpoints: transformers:<hub id or folder>. --json gives every fact (tokenizer, resize '
        'mode, backends).',
        "clip-as-service's names: " + ', '.join(f'{k} = {v}' for k, v in LEGACY_ALIASES.items()),
    )
    print('\n' + '\n'.join(textwrap.fill(note, MAX_WIDTH) for note in notes))
    return 0


def _cell(value) -> str:
    return '-' if value is None else str(value)
