"""What each endpoint sends, and how its answers fill the caller's documents.

Encode, search and rank send each input under an id of its position in the call ('0', '1', ...;
rank matches '3.0', '3.1', ...), never the caller's id: duplicate ids in the input cannot get mixed up,
and a server error naming a document names the input. Index keeps the caller's ids, since an indexer
stores documents by id; it therefore refuses duplicates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from docarray import Document, DocumentArray

from clipserve_client.jina.inputs import Loader, to_content_document


@dataclass
class Item:
    position: int
    wire: Document  # what is sent
    target: Document | None  # what the answer fills: the caller's Document, or None (only the embedding is kept)
    matches: dict[str, Document] = field(default_factory=dict)  # rank: wire id of a match -> the caller's match


class Results:
    """What a call returns: the filled Documents in input order, or their embeddings stacked."""

    def __init__(self, as_documents: bool, keep: bool):
        self.as_documents = as_documents
        self.keep = keep
        self._documents: list[Document] = []
        self._embeddings: list[np.ndarray | None] = []

    def add(self, items: list[Item]) -> None:
        if self.keep:
            if self.as_documents:
                self._documents.extend(item.target for item in items)
            else:
                self._embeddings.extend(None for _ in items)

    def set_embedding(self, position: int, embedding) -> None:
        if self.keep and not self.as_documents:
            self._embeddings[position] = embedding

    def value(self):
        if not self.keep:
            return None
        if self.as_documents:
            return DocumentArray(self._documents)
        if self._embeddings and np.ndim(self._embeddings[0]) == 2:
            # a late-interaction model's (parameters={'multi_vector': True}): [tokens, dim] per input, tokens differ
            return list(self._embeddings)
        return np.stack(self._embeddings) if self._embeddings else []


def _copy_content(doc: Document) -> Document:
    """A separate Document with the same content (and a fresh id): what a raw input becomes for the caller."""
    return Document(text=doc.text or None, blob=doc.blob or None, tensor=doc.tensor, uri=doc.uri or None)


class Method:
    name = ''
    path = ''
    strict = False  # every input must come back

    def endpoint(self, parameters: dict) -> str:
        return self.path

    def item(self, position: int, value, loader: Loader, as_documents: bool) -> Item:
        wire = to_content_document(value, loader, position)
        if isinstance(value, Document):
            target = value
        else:
            target = _copy_content(wire) if as_documents else None
        wire.id = str(position)
        return Item(position, wire, target)

    def fill(self, item: Item, answer: Document, results: Results) -> None:
        raise NotImplementedError

    def restore_ids(self, item: Item, answer: Document) -> None:
        """Give the answer the caller's id back, for on_done/on_error/on_always."""
        if item.target is not None:
            answer.id = item.target.id


class Encode(Method):
    name, path, strict = 'encode', '/encode', True

    def endpoint(self, parameters: dict) -> str:
        model = parameters.pop('model_name', None)
        return f'/encode/{model}' if model else '/encode'

    def fill(self, item, answer, results):
        if answer.embedding is None:
            raise ValueError(
                f'the server returned no embedding for input {item.position}: is it a CLIP encoder behind this address?'
            )
        if item.target is not None:
            item.target.embedding = answer.embedding
        results.set_embedding(item.position, answer.embedding)


class Index(Method):
    name, path = 'index', '/index'

    def __init__(self):
        self._seen: dict[str, int] = {}

    def item(self, position, value, loader, as_documents):
        content = to_content_document(value, loader, position)
        if isinstance(value, Document):
            wire = Document(value, copy=True)  # everything the indexer should store: id, tags, uri, ...
            if not (value.text or value.blob or value.tensor is not None):
                wire.blob = content.blob  # a uri the client read
            target = value
        else:
            wire = target = content
        first = self._seen.setdefault(wire.id, position)
        if first != position:
            raise ValueError(
                f'input {position} has the same id as input {first} ({wire.id!r}): an indexer stores '
                'documents by id, so index() needs unique ids'
            )
        return Item(position, wire, target)

    def fill(self, item, answer, results):
        if answer.embedding is not None:
            item.target.embedding = answer.embedding


class Search(Method):
    name, path = 'search', '/search'

    def fill(self, item, answer, results):
        if answer.embedding is not None:
            item.target.embedding = answer.embedding
        item.target.matches = answer.matches


class Rank(Method):
    name, path, strict = 'rank', '/rank', True

    def endpoint(self, parameters: dict) -> str:
        model = parameters.pop('model_name', None)
        return f'/rank/{model}' if model else '/rank'

    def item(self, position, value, loader, as_documents):
        if not isinstance(value, Document):
            raise TypeError(f'input {position}: rank() takes Documents with .matches, got {type(value).__name__}')
        if not len(value.matches):
            raise ValueError(f'input {position}: rank() needs every Document to have .matches')
        wire = to_content_document(value, loader, position)
        wire.id = str(position)
        matches = {}
        wire_matches = []
        for index, match in enumerate(value.matches):
            wire_match = to_content_document(match, loader, position)
            wire_match.id = f'{position}.{index}'
            matches[wire_match.id] = match
            wire_matches.append(wire_match)
        wire.matches = wire_matches
        return Item(position, wire, value, matches)

    def fill(self, item, answer, results):
        ranked = []
        for answer_match in answer.matches:
            match = item.matches.get(answer_match.id)
            if match is None:
                raise ValueError(
                    f'the server returned a match of input {item.position} that was not sent ({answer_match.id!r})'
                )
            for name, score in answer_match.scores.items():
                match.scores[name] = score
            ranked.append(match)
        if answer.embedding is not None:
            item.target.embedding = answer.embedding
        item.target.matches = ranked  # the caller's own match objects, in the server's order

    def restore_ids(self, item, answer):
        answer.id = item.target.id
        for answer_match in answer.matches:
            if answer_match.id in item.matches:
                answer_match.id = item.matches[answer_match.id].id
