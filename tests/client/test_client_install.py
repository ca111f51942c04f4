"""`pip install ./client` in a fresh virtual environment, next to pydantic 2 and FastAPI: nothing of jina,
docarray, grpc or torch comes with it, and from there it encodes and ranks against a real Flow as
clip-client does over gRPC. And `pip install './client[jina]'`: no torch, and the Jina-protocol client works.

Slow: each builds a venv (without pip: this interpreter's pip installs into it) and installs from the package
index, pip's cache making later runs quick. Measured on the 2-core machine with the Flow up: venv + install
16 s for the default install, 40 s for the jina extra; the whole file ~85 s with the Flow's start.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from clip_client import Client as ClipClient
from docarray import Document

from tests.integration.conftest import ROOT, make_image

from ..compare import assert_cosine
from .conftest import url

TEXTS = ['a photo of a dog', 'a bowl of soup', 'two people on a beach']
SERVER_STACK = ('jina', 'docarray', 'grpcio', 'torch', 'protobuf', 'aiohttp', 'clipserve', 'open-clip-torch')


def fresh_venv(tmp_path, *requirements, constraints: bool = False) -> tuple[str, float]:
    """A venv with only `requirements` (installed by this interpreter's pip: none of its own), and the seconds
    it took. The client is installed from a copy, so the build leaves no build/ folder in the checkout."""
    source = tmp_path / 'client'
    shutil.copytree(ROOT / 'client', source, ignore=shutil.ignore_patterns('*.egg-info', '__pycache__', '.ruff_cache'))
    venv = tmp_path / 'venv'
    started = time.monotonic()
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True)
    python = str(venv / 'bin' / 'python')
    pip = [sys.executable, '-m', 'pip', '--python', python, 'install', '-q', '--disable-pip-version-check']
    if constraints:
        pip += ['-c', str(ROOT / 'constraints.txt')]
    wanted = [str(source) + r[len('client') :] if r.startswith('client') else r for r in requirements]
    result = subprocess.run(pip + wanted, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    return python, time.monotonic() - started


def installed(python: str) -> dict[str, str]:
    """The venv's distributions (-I: isolated, so a checkout's *.egg-info in the working folder is not one)."""
    code = 'import json, importlib.metadata as m; print(json.dumps({d.name.lower(): d.version for d in m.distributions()}))'
    return json.loads(subprocess.run([python, '-I', '-c', code], capture_output=True, text=True, check=True).stdout)


def run(python: str, code: str, cwd) -> str:
    env = {**os.environ, 'NO_VERSION_CHECK': '1', 'PYTHONPATH': ''}
    result = subprocess.run(
        [python, '-c', textwrap.dedent(code)], capture_output=True, text=True, cwd=cwd, env=env, timeout=180
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_the_default_install_lives_next_to_pydantic_2_and_matches_clip_client(tmp_path, plain_flow):
    python, seconds = fresh_venv(tmp_path, 'client', 'pydantic>=2.11', 'fastapi')
    print(f'fresh venv with ./client, pydantic 2 and fastapi: {seconds:.1f} s')
    versions = installed(python)
    assert versions['clipserve-client'] == '0.1.0' and versions['pydantic'].startswith('2.')
    assert {'httpx', 'numpy', 'fastapi'} <= set(versions)
    assert not set(SERVER_STACK) & set(versions), sorted(set(SERVER_STACK) & set(versions))
    assert not [name for name in versions if name.startswith('grpc')]

    image = tmp_path / 'photo.png'
    image.write_bytes(make_image(seed=5))
    out = tmp_path / 'out.npz'
    printed = run(
        python,
        f"""
        import sys
        from pathlib import Path
        import fastapi, pydantic, numpy as np
        from clipserve_client import Client

        class Query(pydantic.BaseModel):  # a pydantic-2 application, in the same process
            text: str
        app = fastapi.FastAPI()
        with Client({url('http', plain_flow['http'])!r}, batch_size=2) as client:
            texts = client.encode([Query(text=t).text for t in {TEXTS!r}])
            image = client.encode([Path({str(image)!r})])
            pixels = client.encode([np.zeros((32, 24, 3), np.uint8)])
            scores = client.rank(Path({str(image)!r}), {TEXTS!r})
            model = client.models()[0]
        np.savez({str(out)!r}, texts=texts, image=image, scores=scores)
        heavy = sorted(m for m in ('jina', 'docarray', 'grpc', 'torch') if m in sys.modules)
        print('PYDANTIC', pydantic.VERSION, 'MODEL', model.id, model.embedding_dimensions, 'HEAVY', heavy, pixels.shape)
        """,
        tmp_path,
    )
    assert 'PYDANTIC 2.' in printed and 'MODEL clipserve-tiny::random 64' in printed, printed
    assert 'HEAVY [] (1, 64)' in printed, printed

    got = np.load(out)
    reference = ClipClient(url('grpc', plain_flow['grpc']))
    want = reference.encode(TEXTS + [str(image)])
    assert_cosine(got['texts'], want[:3], 0.99999)
    assert_cosine(got['image'], want[3:], 0.99999)
    ranked = reference.rank(
        [Document(uri=str(image), matches=[Document(id=str(i), text=t) for i, t in enumerate(TEXTS)])]
    )
    want_scores = {m.id: m.scores['clip_score'].value for m in ranked[0].matches}
    np.testing.assert_allclose(got['scores'], [want_scores[str(i)] for i in range(3)], rtol=1e-4, atol=1e-7)


@pytest.mark.slow
def test_the_jina_extra_installs_no_torch_and_works(tmp_path, plain_flow):
    python, seconds = fresh_venv(tmp_path, 'client[jina]', constraints=True)
    print(f"fresh venv with './client[jina]': {seconds:.1f} s")
    versions = installed(python)
    assert 'jina' in versions and 'torch' not in versions and 'clipserve' not in versions
    printed = run(
        python,
        f"""
        import sys
        from clipserve_client.jina import Client
        out = Client({url('grpc', plain_flow['grpc'])!r}).encode(['a photo of a dog', 'works without torch'])
        print('SHAPE', out.shape, 'TORCH', 'torch' in sys.modules, 'SERVER', 'clipserve' in sys.modules)
        """,
        tmp_path,
    )
    assert 'SHAPE (2, 64) TORCH False SERVER False' in printed, printed
