"""The in-process Model against a served Flow (the session's tiny_flow, called by the unchanged clip-client):
the same texts, images and /rank give the same vectors and the same order, so embedding in process and
serving can be mixed in one index."""

from __future__ import annotations

import numpy as np
from clip_client import Client
from docarray import Document, DocumentArray

from clipserve import Model

from ..compare import assert_close, assert_cosine
from ..conftest import TINY
from .conftest import make_image


def test_model_gives_the_served_embeddings_and_rank(tiny_flow):
    client = Client(f'grpc://127.0.0.1:{tiny_flow["grpc"]}')
    texts = ['a photo of a dog', 'a red car parked on a street', 'hello world']
    pngs = [make_image(seed=i) for i in range(5)]
    served_texts = client.encode(texts)
    served_images = client.encode(DocumentArray([Document(blob=p) for p in pngs])).embeddings
    query = Document(text=texts[0], matches=[Document(id=f'm{i}', blob=p) for i, p in enumerate(pngs)])
    served_rank = client.rank([query])[0].matches

    with Model(TINY, batch_size=4) as model:  # the Flow's minibatch_size; the default precision, as served
        local_texts = model.embed_texts(texts, normalize=False)
        local_images = model.embed_images(pngs, normalize=False)
        ranked = model.rank(text=texts[0], images=pngs)

    assert_close(local_texts, served_texts)  # fp32 here (the tests set CLIPSERVE_CPU_BF16=0): the same numbers
    # images: bf16 where the CPU has it (both sides), whose rows may depend on their batch mates in the last bits
    assert_cosine(local_images, np.asarray(served_images), 0.9999)
    served = {int(m.id[1:]): (m.scores['clip_score'].value, m.scores['clip_score_cosine'].value) for m in served_rank}
    assert sorted(served) == sorted(r.index for r in ranked) == list(range(len(pngs)))
    for r in ranked:  # each candidate's cosine and score as served (bf16 images may move the last digits)
        assert abs(r.cosine - served[r.index][1]) <= 2e-3, (r, served[r.index])
        assert abs(r.score - served[r.index][0]) <= 0.2 * served[r.index][0] + 1e-6, (r, served[r.index])
    scores = [m.scores['clip_score'].value for m in served_rank]
    if scores[0] - scores[1] > 0.05:  # a clear winner is the same winner
        assert ranked[0].index == int(served_rank[0].id[1:])
