"""One model served by the shipped torch and onnx Flows at once, and the checks every model-family Flow test
makes of them through clip-client: embeddings equal to a reference, and /rank's scores."""

import contextlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from clip_client import Client
from docarray import Document, DocumentArray

from ..compare import relative_error
from .conftest import data_uri, flow_from_yaml, free_port, make_image, set_port

TOLERANCES = {'torch': 1e-5, 'onnx': 1e-5}  # embeddings: max |d| relative to the vector's norm
RANK_TOLERANCES = {'torch': 1e-4, 'onnx': 1e-3}  # scores


@contextlib.contextmanager
def torch_and_onnx_flows(name: str, exported: Path, directory: Path):
    """flows/torch.yml serving `name` and flows/onnx.yml serving its export; yields {backend: gRPC port}."""
    ports = {'torch': free_port(), 'onnx': free_port()}
    directory.mkdir(parents=True, exist_ok=True)
    torch_flow = flow_from_yaml(
        'torch.yml', directory, lambda c: set_port(c, ports['torch']), {'CLIPSERVE_MODEL': name}
    )
    onnx_flow = flow_from_yaml(
        'onnx.yml',
        directory,
        lambda c: set_port(c, ports['onnx']),
        {'CLIPSERVE_MODEL': name, 'CLIPSERVE_MODEL_PATH': str(exported)},
    )
    with ThreadPoolExecutor(2) as starting:  # both Flows start at once: their processes' imports overlap
        list(starting.map(lambda flow: flow.start(), (torch_flow, onnx_flow)))
    try:
        yield ports
    finally:
        torch_flow.close()
        onnx_flow.close()


def assert_encodings_match(ports: dict, label: str, texts, images: list[bytes], want_texts, want_images) -> None:
    """clip-client's embeddings of `texts` and `images` on both Flows equal the reference's."""
    for backend, tolerance in TOLERANCES.items():
        client = Client(f'grpc://127.0.0.1:{ports[backend]}')
        got_texts = client.encode(texts)
        got_images = client.encode(DocumentArray([Document(blob=data) for data in images])).embeddings
        assert got_texts.shape == want_texts.shape and got_images.shape == want_images.shape
        text_diff, image_diff = relative_error(got_texts, want_texts), relative_error(got_images, want_images)
        print(f'\n{label} {backend} flow vs the reference, relative: texts {text_diff:.2e}, images {image_diff:.2e}')
        assert text_diff <= tolerance and image_diff <= tolerance


def clip_scores(candidates: np.ndarray, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(cosine, softmax of 100 x cosine) of each candidate to the query: clip-as-service's /rank."""
    cosine = candidates @ query / (np.linalg.norm(candidates, axis=1) * np.linalg.norm(query))
    softmax = np.exp(100 * cosine - (100 * cosine).max())
    return cosine, softmax / softmax.sum()


def assert_rank_matches(ports: dict, image: bytes, candidates: list[str], cosine, softmax, extra=None) -> None:
    """/rank of `image` over the text `candidates` on both Flows: scores and order as computed, plus any
    `extra` named score ({name: values}) and no score the reference does not have."""
    extra = extra or {}
    for backend, tolerance in RANK_TOLERANCES.items():
        doc = Document(blob=image, matches=[Document(text=t) for t in candidates])
        ranked = Client(f'grpc://127.0.0.1:{ports[backend]}').rank(DocumentArray([doc]))[0].matches
        for match in ranked:
            i = candidates.index(match.text)
            assert abs(match.scores['clip_score'].value - softmax[i]) <= tolerance
            assert abs(match.scores['clip_score_cosine'].value - cosine[i]) <= tolerance
            assert set(match.scores) - {'clip_score', 'clip_score_cosine'} == set(extra)
            for name, values in extra.items():
                assert abs(match.scores[name].value - values[i]) <= tolerance
        assert [m.text for m in ranked] == [candidates[i] for i in np.argsort(-softmax, kind='stable')]


def assert_flow_equals_torch_flow(ports: dict, other: str, label: str, dim: int, tolerance: float = 1e-5) -> None:
    """clip-client's texts and images (a blob and a data URI) through the `other` Flow equal the torch Flow's."""
    texts = ['a photo of a dog', 'a diagram', 'a much longer caption about a dog sitting on a red chair']
    images = DocumentArray([Document(blob=make_image(300, 200, seed=1)), Document(uri=data_uri(make_image(seed=2)))])
    out = {}
    for backend in ('torch', other):
        client = Client(f'grpc://127.0.0.1:{ports[backend]}')
        out[backend] = (client.encode(texts), client.encode(DocumentArray(images, copy=True)).embeddings)
    assert out[other][0].shape == out['torch'][0].shape and out[other][1].shape == out['torch'][1].shape
    text_diff = relative_error(out[other][0], out['torch'][0])
    image_diff = relative_error(out[other][1], out['torch'][1])
    print(f'\n{other} flow vs torch flow ({label}), relative: texts {text_diff:.2e}, images {image_diff:.2e}')
    assert out[other][0].shape == (3, dim) and out[other][0].dtype == np.float32
    assert text_diff <= tolerance and image_diff <= tolerance
