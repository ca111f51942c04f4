"""The synchronous client: one httpx connection pool, requests sent one batch after another."""

from __future__ import annotations

import time

import httpx
import numpy as np

from clipserve_client.base import ClientBase
from clipserve_client.connection import answer_of, transport_error
from clipserve_client.errors import APIStatusError, shift_items
from clipserve_client.inputs import batches, check_many, prepare, prepare_each
from clipserve_client.partial import Encoded, Pieces, gather
from clipserve_client.progress import Progress, ProgressArg
from clipserve_client.retry import Attempts
from clipserve_client.wire import (
    EMBEDDINGS,
    MODELS,
    RANK,
    RERANK,
    SEARCH,
    Found,
    Model,
    Reranked,
    embeddings_body,
    read_embeddings,
    read_found,
    read_models,
    read_reranked,
    read_scores,
    rerank_body,
)


class Client(ClientBase):
    """A client of a clipserve gateway's HTTP port, one request after another (the parameters: ClientBase's).

    Use it as a context manager, or call ``close()``, to release its connections::

        with Client('http://127.0.0.1:51001') as client:
            vectors = client.encode(['a photo of a dog', Path('dog.jpg')])
    """

    def _open(self) -> httpx.Client:
        return httpx.Client(**self._settings.httpx_options())

    def encode(
        self, inputs, *, model: str | None = None, batch_size: int | None = None, progress: ProgressArg = None
    ) -> np.ndarray:
        """Embed texts and images (mixed freely), in order.

        :param inputs: a list or any iterable of str, bytes, pathlib.Path, numpy arrays, PIL images,
            ``{"text": ...}`` or ``{"image": ...}`` (see the README for what a str means)
        :param model: this call's model (default: the client's)
        :param batch_size: inputs per request (default: the client's)
        :param progress: True for a tqdm bar, or a callable ``progress(done, total)``
        :return: float32 array [N, D], each row L2-normalised (the server's OpenAI route normalises);
            shape (0, 0) for no inputs
        """
        check_many(inputs, 'encode')
        size, model = self._batch_size(batch_size), self._model(model)
        rows = []
        with Progress(progress, len(inputs) if hasattr(inputs, '__len__') else None, 'encode') as bar:
            for offset, chunk in batches(inputs, size):
                items = prepare(chunk, offset, self._settings.loader)
                answer = self._request('POST', EMBEDDINGS, embeddings_body(items, model), offset)
                rows.append(read_embeddings(answer, len(items)))
                bar.advance(len(items))
        return np.concatenate(rows) if rows else np.zeros((0, 0), np.float32)

    def encode_partial(
        self, inputs, *, model: str | None = None, batch_size: int | None = None, progress: ProgressArg = None
    ) -> Encoded:
        """`encode`, where a bad input costs only its own row: an ``Encoded`` with the vectors of the inputs
        that worked (``vectors``, their positions in ``indices``) and ``failed``: {position: reason} for the
        others (unreadable here, or refused by the server). Errors that are not about inputs still raise."""
        check_many(inputs, 'encode_partial')
        size, model = self._batch_size(batch_size), self._model(model)
        done = []
        with Progress(progress, len(inputs) if hasattr(inputs, '__len__') else None, 'encode') as bar:
            for offset, chunk in batches(inputs, size):
                pieces = Pieces(offset, prepare_each(chunk, offset, self._settings.loader))
                while (part := pieces.next()) is not None:
                    try:
                        answer = self._request('POST', EMBEDDINGS, embeddings_body(pieces.items_of(part), model))
                    except APIStatusError as error:
                        pieces.refused(part, error)
                    else:
                        pieces.answered(part, read_embeddings(answer, len(part)))
                done.append(pieces)
                bar.advance(len(chunk))
        return gather(done)

    def rank(self, query, documents, *, model: str | None = None, score: str = 'clip_score') -> np.ndarray:
        """Score `documents` (texts or images) against `query` (a text or an image), in the documents' order.

        :param score: ``clip_score`` (softmax of 100 x cosine over these documents, as clip-client's rank),
            ``clip_score_cosine``, or ``siglip_score`` (SigLIP models)
        :return: float64 array [len(documents)]; one request (a softmax is over one request's documents)
        """
        body, count = self._rank_body(query, documents, model, score)
        return read_scores(self._request('POST', RANK, body), count, score)

    def rerank(
        self,
        query: str,
        documents,
        *,
        model: str | None = None,
        top_n: int | None = None,
        max_length: int | None = None,
    ) -> list[Reranked]:
        """Rerank texts against a text query with the server's cross-encoder (/v1/rerank): results best first,
        each with its position in `documents` and its relevance score (per pair: it does not depend on the other
        documents). `model`: the reranker, when the server has several."""
        return read_reranked(
            self._request('POST', RERANK, rerank_body(query, documents, model, top_n, max_length)), len(documents)
        )

    def search(
        self,
        query=None,
        *,
        vector=None,
        top_k: int = 10,
        filter: dict | None = None,
        rerank=None,
        model: str | None = None,
    ) -> list[Found]:
        """Search the server's index (/v1/search, flows/search.yml) with a text or an image (any input `encode`
        takes), or a vector; best first. `filter`: clip-as-service's filter syntax or Qdrant's; `rerank`: True or
        {"top_n": n} to rerank the candidates' captions with the server's reranker."""
        body = self._search_body(query, vector, top_k, filter, rerank, model)
        return read_found(self._request('POST', SEARCH, body))

    def models(self) -> list[Model]:
        """The models the server serves, the default one first."""
        return read_models(self._request('GET', MODELS))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _request(self, method: str, path: str, body: dict | None = None, offset: int = 0) -> dict:
        """One request, sent again after retryable failures; errors name the caller's input positions."""
        attempts = Attempts(self._settings.retry)
        while True:
            try:
                return answer_of(self._http.request(method, path, json=body))
            except httpx.HTTPError as error:
                failure = transport_error(error, self.server + path, self._settings.timeout)
            except APIStatusError as error:
                failure = shift_items(error, offset)
            time.sleep(attempts.failed(failure))
