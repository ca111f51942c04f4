"""The fp16 ONNX cache: converted from the file path with external data, once across processes, and a
corrupt cached copy rejected and redone.

onnxruntime's CPU provider cannot run every fp16 graph with its optimisations on (and clipserve serves
fp16 ONNX on CUDA only), so the converted graphs are run here with optimisations off, against fp32.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from clipserve.backends.onnx.fp16 import DATA_FILE, INTEGRITY_FILE, MODEL_FILE, fp16_copy

WIDTH, LAYERS = 1024, 8  # 32 MB of weights: enough for two conversions to overlap in time


def make_graph(folder: Path) -> Path:
    """A real ONNX graph (MatMul, Add, Relu, LayerNormalization) with its weights in external data."""
    rng = np.random.default_rng(0)
    nodes, initializers, previous = [], [], 'x'
    for i in range(LAYERS):
        weight = numpy_helper.from_array((rng.normal(size=(WIDTH, WIDTH)) / WIDTH**0.5).astype(np.float32), f'w{i}')
        bias = numpy_helper.from_array(rng.normal(size=WIDTH).astype(np.float32) * 0.1, f'b{i}')
        initializers += [weight, bias]
        nodes += [
            helper.make_node('MatMul', [previous, f'w{i}'], [f'm{i}']),
            helper.make_node('Add', [f'm{i}', f'b{i}'], [f'a{i}']),
            helper.make_node('Relu', [f'a{i}'], [f'r{i}']),
        ]
        previous = f'r{i}'
    initializers += [
        numpy_helper.from_array(np.ones(WIDTH, np.float32), 'gamma'),
        numpy_helper.from_array(np.zeros(WIDTH, np.float32), 'beta'),
    ]
    nodes.append(helper.make_node('LayerNormalization', [previous, 'gamma', 'beta'], ['y'], axis=-1))
    graph = helper.make_graph(
        nodes,
        'synthetic',
        [helper.make_tensor_value_info('x', TensorProto.FLOAT, ['batch', WIDTH])],
        [helper.make_tensor_value_info('y', TensorProto.FLOAT, ['batch', WIDTH])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid('', 18)])
    path = folder / 'visual.onnx'
    onnx.save_model(model, str(path), save_as_external_data=True, location='visual.onnx.data')
    return path


def run(path: Path, x: np.ndarray, optimise: bool = True) -> np.ndarray:
    options = ort.SessionOptions()
    if not optimise:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=['CPUExecutionProvider']).run(None, {'x': x})[0]


@pytest.fixture()
def source(tmp_path, monkeypatch):
    monkeypatch.setenv('CLIPSERVE_CACHE', str(tmp_path / 'cache'))
    folder = tmp_path / 'export'
    folder.mkdir()
    return make_graph(folder)


def test_conversion_keeps_float32_io_and_writes_external_data(source):
    converted = fp16_copy(source)
    folder = converted.parent
    assert {p.name for p in folder.iterdir()} == {MODEL_FILE, DATA_FILE, INTEGRITY_FILE}
    assert (folder / DATA_FILE).stat().st_size > 10 * 2**20 > (folder / MODEL_FILE).stat().st_size
    model = onnx.load(str(converted), load_external_data=False)
    assert {t.data_type for t in model.graph.initializer if t.name.startswith('w')} == {TensorProto.FLOAT16}
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    x = np.random.default_rng(1).normal(size=(4, WIDTH)).astype(np.float32)
    got, want = run(converted, x, optimise=False), run(source, x)
    assert got.dtype == np.float32 and np.abs(got - want).max() < 0.05
    assert fp16_copy(source) == converted  # reused, not converted again


def test_a_corrupt_cached_copy_is_rejected_and_converted_again(source, caplog):
    converted = fp16_copy(source)
    data = converted.parent / DATA_FILE
    good = data.read_bytes()
    with open(data, 'r+b') as f:  # same size, different bytes: what a torn write leaves
        f.seek(len(good) // 2)
        f.write(b'\xff' * 4096)
    caplog.set_level('WARNING')
    again = fp16_copy(source)
    assert again == converted and data.read_bytes() == good
    assert 'incomplete or corrupt' in caplog.text
    # a copy cut short (no integrity record yet) is redone too
    (converted.parent / INTEGRITY_FILE).unlink()
    assert fp16_copy(source) == converted
    assert json.loads((converted.parent / INTEGRITY_FILE).read_text())['files'][DATA_FILE]['bytes'] == len(good)


def test_two_processes_converting_at_once_convert_once(source, tmp_path):
    gate = tmp_path / 'go'
    script = (
        'import logging, sys, time, os\n'
        'from pathlib import Path\n'
        'logging.basicConfig(level=logging.INFO, stream=sys.stderr)\n'
        'from clipserve.backends.onnx.fp16 import fp16_copy\n'
        'print("ready", flush=True)\n'
        f'while not os.path.exists({str(gate)!r}): time.sleep(0.005)\n'
        f'print(fp16_copy(Path({str(source)!r})))\n'
    )
    processes = [
        subprocess.Popen([sys.executable, '-c', script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    ready = [p.stdout.readline().strip() for p in processes]  # both imported, at the gate
    assert ready == ['ready', 'ready'], [p.communicate(timeout=60) for p in processes]  # a child that failed: why
    gate.touch()
    outputs = [p.communicate(timeout=300) for p in processes]
    assert all(p.returncode == 0 for p in processes), outputs
    paths = {out.strip() for out, _ in outputs}
    assert len(paths) == 1
    logs = ''.join(err for _, err in outputs)
    assert logs.count(' to fp16 into ') == 1, logs
    converted = Path(paths.pop())
    leftovers = [p.name for p in converted.parent.parent.iterdir() if p.name.startswith('.')]
    assert leftovers == [], leftovers  # no temporary directories left behind
    x = np.random.default_rng(2).normal(size=(2, WIDTH)).astype(np.float32)
    assert np.abs(run(converted, x, optimise=False) - run(source, x)).max() < 0.05
