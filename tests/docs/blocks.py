"""The fenced code blocks of the README and the docs, with the `<!-- test: ... -->` marker above each.

    <!-- test: flow=multi-protocol expect="clip_score" -->      run against that Flow; output must contain it
    <!-- test: flow=auth continue -->                           run in the namespace of the block before it
    <!-- test: local -->                                       run without a Flow
    <!-- test: local cwd=repo -->                              ... in the repository's root (default: a scratch folder)
    <!-- test: yaml-flow -->                                   a YAML block Jina must load as a Flow
    <!-- test: skip: REASON -->                                not run; REASON names what covers it

The marker is the last non-blank line before the fence (an HTML comment: invisible on GitHub and in the site).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / 'docs'
# pages other engineers write: their blocks run where they carry a marker, but need none
EXTERNAL_PAGES = ('bulk.md', 'containers.md', 'limits.md', 'docarray-v2.md')
RUNNABLE_LANGUAGES = ('python', 'bash', 'sh', 'shell', 'console')
FENCE = re.compile(r'^(?P<indent>\s*)(?P<fence>```+|~~~+)(?P<info>[^`]*)$')
MARKER = re.compile(r'^\s*<!--\s*test:(?P<body>.*?)-->\s*$')


@dataclass(frozen=True)
class Marker:
    kind: str  # flow, local, yaml-flow, skip
    flow: str | None = None
    chained: bool = False
    expect: str | None = None
    reason: str = ''
    in_repo: bool = False  # cwd=repo: run in the repository's root


@dataclass
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    marker: Marker | None
    chain: list[Block] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f'{self.path.relative_to(ROOT)}:{self.line}'


def parse_marker(body: str, where: str) -> Marker:
    body = body.strip()
    if body.startswith('skip'):
        reason = body[4:].lstrip(':').strip()
        return Marker('skip', reason=reason)
    words = shlex.split(body)
    options = dict(w.split('=', 1) for w in words if '=' in w)
    flags = {w for w in words if '=' not in w}
    unknown = (set(options) - {'flow', 'expect', 'cwd'}) | (flags - {'local', 'continue', 'yaml-flow'})
    if options.get('cwd', 'repo') != 'repo':
        raise ValueError(f'{where}: cwd= takes only repo')
    if unknown:
        raise ValueError(f'{where}: unknown marker words {sorted(unknown)} in <!-- test:{body} -->')
    if 'yaml-flow' in flags:
        return Marker('yaml-flow')
    kind = 'flow' if 'flow' in options else 'local' if 'local' in flags else None
    if kind is None:
        raise ValueError(f'{where}: a marker needs flow=NAME, local, yaml-flow or skip: <!-- test:{body} -->')
    return Marker(kind, options.get('flow'), 'continue' in flags, options.get('expect'), in_repo='cwd' in options)


def read_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding='utf-8').splitlines()
    blocks, i, previous = [], 0, ''
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening or not opening.group('info').strip():
            if lines[i].strip():
                previous = lines[i]
            i += 1
            continue
        indent, fence = opening.group('indent'), opening.group('fence')
        language = opening.group('info').strip().split()[0].lower()
        body, j = [], i + 1
        while j < len(lines) and lines[j].strip() != fence:
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        found = MARKER.match(previous)
        where = f'{path.relative_to(ROOT)}:{i + 1}'
        blocks.append(
            Block(path, i + 1, language, '\n'.join(body) + '\n', parse_marker(found['body'], where) if found else None)
        )
        previous, i = '', j + 1
    return blocks


def pages() -> list[Path]:
    return [ROOT / 'README.md', *sorted(DOCS.rglob('*.md'))]


def owned(path: Path) -> bool:
    """Pages whose every runnable block must carry a marker (the README and the docs' own pages)."""
    return path.relative_to(ROOT).as_posix() not in {f'docs/{name}' for name in EXTERNAL_PAGES}


def all_blocks() -> list[Block]:
    return [block for path in pages() for block in read_blocks(path)]


def runnable_chains() -> list[Block]:
    """Blocks to run, each with the `continue` blocks after it (block.chain), grouped by Flow in a fixed order."""
    chains: list[Block] = []
    for block in all_blocks():
        marker = block.marker
        if marker is None or marker.kind not in ('flow', 'local'):
            continue
        if marker.chained:
            head = chains[-1] if chains else None
            if head is None or head.path != block.path or head.marker.flow != marker.flow:
                raise ValueError(
                    f'{block.where}: `continue` without a block before it on the page with flow={marker.flow}'
                )
            head.chain.append(block)
        else:
            block.chain = [block]
            chains.append(block)
    order = ['local', 'multi-protocol', 'auth', 'multi-model', 'monitoring', 'tls']
    return sorted(
        chains, key=lambda b: order.index(b.marker.flow or 'local') if (b.marker.flow or 'local') in order else 99
    )
