"""The code rules CI enforces: ruff's lint and format (pyproject.toml [tool.ruff]), the import contracts of the
layers (pyproject.toml [tool.importlinter]: each layer package imports only those below it; the client
imports nothing of the server; nothing below serving/ imports Jina or DocArray), no import cycle between
modules, and no module over 400 lines."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_ruff_lint_passes():
    result = subprocess.run(
        [BIN / 'ruff', 'check', 'executors', 'client', 'tests', 'benchmarks', 'fuzz', 'devkit'],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]


def test_ruff_format_is_applied():
    """`ruff format` (pyproject.toml [tool.ruff.format]) leaves every file as it is."""
    result = subprocess.run(
        [BIN / 'ruff', 'format', '--check', 'executors', 'client', 'tests', 'benchmarks', 'fuzz', 'devkit'],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]


def test_import_contracts_hold():
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(ROOT / 'executors'), str(ROOT / 'client')])}
    result = subprocess.run(
        [BIN / 'lint-imports', '--no-cache'], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]


def _import_cycles(package: str) -> list[list[str]]:
    """The groups of `package`'s modules that import one another in a circle (strongly connected components
    of the module import graph with more than one module, or a module importing itself), as grimp reads
    every import statement, function-level and TYPE_CHECKING ones included."""
    import grimp

    graph = grimp.build_graph(package, cache_dir=None)
    modules = sorted(m for m in graph.modules if m == package or m.startswith(package + '.'))
    edges = {m: sorted(i for i in graph.find_modules_directly_imported_by(m) if i in modules) for m in modules}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []
    for root in modules:  # Tarjan's algorithm, iterative (the graph is deep enough for Python's recursion limit)
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1 or node in edges[node]:
                        cycles.append(sorted(group))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(edges[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return cycles


def test_no_import_cycles():
    """No module of clipserve (or of the client) imports, directly or through others, a module that imports it
    back: a circle makes import order matter and the layers unreadable (models/families/ and models/registry.py
    were one). Break one by moving what both need into a module of its own, below both."""
    sys.path[:0] = [str(ROOT / 'executors'), str(ROOT / 'client')]
    try:
        cycles = _import_cycles('clipserve') + _import_cycles('clipserve_client')
    finally:
        del sys.path[:2]
    assert not cycles, 'import cycles:\n' + '\n'.join(' <-> '.join(group) for group in cycles)


MAX_LINES = 400
CHECKED_FOLDERS = ('executors/clipserve', 'client', 'tests', 'benchmarks', 'devkit')


def _python_files(folder: Path):
    for path in sorted(folder.rglob('*.py')):
        parts = path.relative_to(ROOT).parts
        if not any(p.startswith('.') or p in ('build', '__pycache__') or p.endswith('.egg-info') for p in parts):
            yield path


def test_no_module_over_400_lines():
    """A module a reader can hold in mind: none over 400 lines in the package, the client, the tests or the
    benchmarks. Split a long one by what its parts do (a test file by the code it checks)."""
    long = {
        str(path.relative_to(ROOT)): count
        for folder in CHECKED_FOLDERS
        for path in _python_files(ROOT / folder)
        if (count := len(path.read_text(encoding='utf-8').splitlines())) > MAX_LINES
    }
    assert not long, f'modules over {MAX_LINES} lines: {long}'


MAX_FUNCTION_LINES = 60


def test_no_function_over_60_lines_in_serving_and_the_engine():
    """A function a reader can follow: none over 60 lines (decorators and docstring included) where requests
    are scheduled and served. Extract the steps it runs, named by what they do."""
    import ast

    long = {}
    for folder in ('executors/clipserve/serving', 'executors/clipserve/engine'):
        for path in _python_files(ROOT / folder):
            for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    size = node.end_lineno - min([node.lineno, *(d.lineno for d in node.decorator_list)]) + 1
                    if size > MAX_FUNCTION_LINES:
                        long[f'{path.relative_to(ROOT)}:{node.lineno} {node.name}'] = size
    assert not long, f'functions over {MAX_FUNCTION_LINES} lines: {long}'


def test_benchmarks_import_no_test_code_and_leave_sys_path_alone():
    """The benchmarks run as modules from the root (python -m benchmarks.NAME): what they share with the tests
    lives in devkit/, and none of them reaches into tests/ or edits sys.path to find a sibling."""
    import re

    pattern = re.compile(r'^\s*(from tests\b|import tests\b|sys\.path\.(insert|append))', re.MULTILINE)
    offenders = [p.name for p in _python_files(ROOT / 'benchmarks') if pattern.search(p.read_text(encoding='utf-8'))]
    assert not offenders, offenders
    assert pattern.search('sys.path.insert(0, ROOT)\nfrom tests.procfs import x')  # the check itself can fail


def test_no_extra_is_named_like_a_version():
    """pip 25 (Python 3.13 images) evaluates `extra == "v1"` as a version comparison and stops with
    `InvalidVersion: 'torch'` when installing any other extra: the DocArray extras were once `v1`/`v2`."""
    import tomllib
    from packaging.version import InvalidVersion, Version

    extras = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['optional-dependencies']
    versions = []
    for name in extras:
        try:
            Version(name)
        except InvalidVersion:
            continue
        versions.append(name)
    assert not versions, f'extras that parse as versions (rename them): {versions}'
    for name in ('v1', 'v2', '1.0'):  # the check itself can fail
        Version(name)


def test_jina_and_docarray_stay_behind_the_serving_door():
    """Jina and DocArray are imported by serving/jina/ (the door both processes share) and, besides it, only by
    the gateway classes Jina's gateway is extended into and the v1 replica's documents and executors. The
    package's top level holds at most 13 modules (a package per layer, the two bottom modules errors and
    environment, the entry points): the rest of clipserve runs, and is tested, without either."""
    import re

    package = ROOT / 'executors' / 'clipserve'
    pattern = re.compile(r'^\s*(from|import) (jina|docarray)\b', re.MULTILINE)
    importers = sorted(str(p.relative_to(package)) for p in package.rglob('*.py') if pattern.search(p.read_text()))
    beside_the_door = {'serving/gateway/gateways.py', 'serving/replica/documents.py', 'serving/replica/executors.py'}
    assert any(p.startswith('serving/jina/') for p in importers), importers  # the check itself can fail
    strays = [p for p in importers if not p.startswith('serving/jina/') and p not in beside_the_door]
    assert not strays, strays
    top_level = [p for p in package.iterdir() if p.suffix == '.py' or (p / '__init__.py').is_file()]
    assert len(top_level) <= 13, sorted(p.name for p in top_level)


def test_the_version_is_pyprojects():
    import tomllib

    from clipserve.config.version import __version__

    assert __version__ == tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['version']


def test_the_backend_names_are_written_once():
    """clipserve/models/runtimes.py names the runtimes; every other module imports the names from it."""
    import re

    listed = re.compile(r"""\(\s*['"]torch['"]\s*,\s*['"]onnx['"]""")
    package = ROOT / 'executors' / 'clipserve'
    where = sorted(str(p.relative_to(package)) for p in package.rglob('*.py') if listed.search(p.read_text()))
    assert where == ['models/runtimes.py'], where
