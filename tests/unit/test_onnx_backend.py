"""ONNX export and the ONNX Runtime backend, against the torch backend on the same weights."""

import json
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

from clipserve.backends import BackendOptions, create_backend
from clipserve.backends.export_format import export_cache_dir
from clipserve.backends.onnx.backend import OnnxBackend
from clipserve.backends.onnx.export import ExportError, export_onnx, verify_export
from clipserve.errors import BackendUnavailableError, WeightsUnavailableError
from clipserve.models.tokenizer import Tokenizer

from ..compare import assert_close, relative_error
from ..conftest import TINY
from ..onnx_helpers import make_clip_as_service_layout

CPU = BackendOptions(device='cpu')
TEXTS = ['a photo of a dog', 'a much longer caption about a dog on a red chair in a garden', '!', '']


@pytest.fixture(scope='module')
def tiny_export(tmp_path_factory):
    out = tmp_path_factory.mktemp('tiny-onnx')
    metadata = export_onnx(TINY, out)
    return out, metadata


def _pixels(n=3, size=224):
    return np.random.default_rng(0).normal(size=(n, 3, size, size)).astype(np.float32)


def test_export_layout_and_metadata(tiny_export):
    out, metadata = tiny_export
    assert {p.name for p in out.iterdir()} == {
        'visual.onnx',
        'visual.onnx.data',
        'textual.onnx',
        'textual.onnx.data',
        'clipserve.json',
    }
    assert (out / 'textual.onnx').stat().st_size < 2_000_000  # the weights live in the .data files
    saved = json.loads((out / 'clipserve.json').read_text())
    for key in ('model', 'embed_dim', 'image_size', 'mean', 'std', 'tokenizer', 'opset', 'exporter', 'weights_sha256'):
        assert key in saved
    assert saved['model'] == TINY and saved['embed_dim'] == 64 and saved['dynamic_sequence'] is True
    assert max(metadata.max_abs_diff.values()) < 1e-4
    visual = ort.InferenceSession(str(out / 'visual.onnx'))
    textual = ort.InferenceSession(str(out / 'textual.onnx'))
    assert [i.name for i in visual.get_inputs()] == ['pixel_values']
    assert [i.name for i in textual.get_inputs()] == ['input_ids', 'attention_mask']
    assert isinstance(textual.get_inputs()[0].shape[0], str) and isinstance(textual.get_inputs()[0].shape[1], str)


@pytest.mark.precision
def test_onnx_equals_torch(tiny_export, tiny_backend):
    onnx_backend = create_backend('onnx', TINY, CPU, model_path=str(tiny_export[0]))
    tokens = Tokenizer()(TEXTS)
    image_diff = relative_error(onnx_backend.encode_images(_pixels()), tiny_backend.encode_images(_pixels()))
    text_diff = relative_error(
        onnx_backend.encode_texts(tokens.input_ids, tokens.attention_mask),
        tiny_backend.encode_texts(tokens.input_ids, tokens.attention_mask),
    )
    print(f'\nonnx vs torch ({TINY}): images {image_diff:.2e}, texts {text_diff:.2e}')
    assert image_diff < 1e-5 and text_diff < 1e-5
    assert onnx_backend.trims_padding and onnx_backend.encode_images(_pixels(1)).dtype == np.float32


def test_clip_as_service_layout(tiny_export, tiny_backend, tmp_path):
    folder = make_clip_as_service_layout(tiny_export[0], tmp_path / 'ViT-B-32-openai')
    backend = OnnxBackend(TINY, CPU, model_path=str(folder))
    assert not backend.trims_padding  # fixed 77-token input, as clip-as-service shipped
    assert backend.embed_dim == 64 and backend.image_size == 224
    tokens = Tokenizer()(TEXTS)
    assert_close(backend.encode_texts(tokens.input_ids), tiny_backend.encode_texts(tokens.input_ids), rel=1e-4)
    assert_close(backend.encode_images(_pixels()), tiny_backend.encode_images(_pixels()), rel=1e-4)


def test_inline_export(tmp_path, tiny_backend):
    """One self-contained file per tower, as clip-as-service shipped them (`export onnx --inline`)."""
    metadata = export_onnx(TINY, tmp_path, external_data=False)
    assert {p.name for p in tmp_path.iterdir()} == {'visual.onnx', 'textual.onnx', 'clipserve.json'}
    backend = OnnxBackend(TINY, CPU, model_path=str(tmp_path))
    assert_close(backend.encode_images(_pixels()), tiny_backend.encode_images(_pixels()), rel=1e-4)
    assert max(metadata.max_abs_diff.values()) < 1e-4


def test_verification_rejects_a_wrong_graph(tiny_export, tmp_path):
    from clipserve.models.names import parse_model_name
    from clipserve.models.registry import build_model, resolve
    from clipserve.models.towers import ImageTower, TextTower

    resolved = resolve(parse_model_name(TINY))
    other = build_model(resolved)
    import torch

    with torch.no_grad():
        other.visual.ln_post.bias += 1  # different weights than the exported graph
    with pytest.raises(ExportError, match='visual.onnx differs'):
        verify_export(tiny_export[0], ImageTower(other), TextTower(other), Tokenizer(), resolved.preprocess)


@pytest.mark.parametrize('make', [lambda p: p / 'missing', lambda p: p])
def test_bad_model_path(tmp_path, make):
    with pytest.raises(WeightsUnavailableError, match='visual.onnx and textual.onnx'):
        OnnxBackend(TINY, CPU, model_path=str(make(tmp_path)))


def test_cuda_requested_but_missing_fails_at_start(tiny_export):
    if 'CUDAExecutionProvider' in ort.get_available_providers():
        pytest.skip('this onnxruntime has a CUDA provider')
    with pytest.raises(BackendUnavailableError, match='no CUDA provider'):
        OnnxBackend(TINY, BackendOptions(device='cuda'), model_path=str(tiny_export[0]))
    with pytest.raises(BackendUnavailableError, match='fp16'):
        OnnxBackend(TINY, BackendOptions(device='cpu', dtype='fp16'), model_path=str(tiny_export[0]))


def test_model_name_exports_once_into_the_cache(tmp_path, monkeypatch, tiny_backend):
    monkeypatch.setenv('CLIPSERVE_CACHE', str(tmp_path))
    first = OnnxBackend(TINY, CPU)
    folder = export_cache_dir(TINY)
    assert first.folder == folder and (folder / 'clipserve.json').is_file()
    stamp = (folder / 'visual.onnx').stat().st_mtime_ns
    second = OnnxBackend(TINY, CPU)
    assert (folder / 'visual.onnx').stat().st_mtime_ns == stamp  # loaded, not exported again
    assert_close(second.encode_images(_pixels(1)), tiny_backend.encode_images(_pixels(1)), rel=1e-4)


def test_cache_key_depends_on_model_and_settings(tmp_path, monkeypatch):
    monkeypatch.setenv('CLIPSERVE_CACHE', str(tmp_path))
    assert export_cache_dir(TINY) != export_cache_dir('ViT-B-32::random')
    assert export_cache_dir(TINY) != export_cache_dir(TINY, opset=19)
    assert export_cache_dir('ViT-B/32') == export_cache_dir('ViT-B-32::openai')


def test_onnx_backend_imports_no_torch(tiny_export):
    code = (
        'import sys; from clipserve.backends import create_backend, BackendOptions; '
        f'b = create_backend("onnx", None, BackendOptions(device="cpu"), model_path={str(tiny_export[0])!r}); '
        'import numpy as np; b.encode_texts(np.array([[49406, 320, 49407]])); '
        'assert "torch" not in sys.modules and "open_clip" not in sys.modules, "torch was imported"'
    )
    subprocess.run([sys.executable, '-c', code], check=True)


def test_cli_export_prints_parity(tmp_path):
    result = subprocess.run(
        [sys.executable, '-m', 'clipserve', 'export', 'onnx', TINY, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert 'visual.onnx: max |onnxruntime - torch|' in result.stdout
    assert 'textual.onnx: max |onnxruntime - torch|' in result.stdout


def test_on_a_cpu_the_sessions_threads_spin_within_a_pass_and_stop_when_it_returns(tiny_export):
    # Spinning after a pass, one session's threads would take the cores of the other session's next pass, and
    # of the decoding between passes (docs/benchmarks.md, Overload); spinning within a pass is kept (fast).
    backend = OnnxBackend(TINY, BackendOptions(device='cpu', num_threads=2), model_path=str(tiny_export[0]))

    def config(session, key):
        try:
            return session.get_session_options().get_session_config_entry(key)
        except RuntimeError:  # not set: onnxruntime's default
            return None

    for session in (backend.visual, backend.textual):
        assert config(session, 'session.force_spinning_stop') == '1'
        assert config(session, 'session.intra_op.allow_spinning') in (None, '1')
        assert session.get_session_options().intra_op_num_threads == 2
