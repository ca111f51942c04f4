"""What the index stores and returns: points (an id, a vector or a page of vectors, a payload) and hits.

Qdrant names points by unsigned integers or UUIDs; documents are named by any string (docarray's hex ids,
a file name, `doc1`). A document's point id is therefore the UUID5 of its id, the same on every shard and
every run, and the document's own id is kept in the payload (`id`), where answers read it back.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import numpy as np

#: the namespace of point ids (uuid5 of a document id); fixed forever: changing it orphans every index
POINT_NAMESPACE = uuid.UUID('6b1f3d0e-2c41-5a8e-9b7c-3d2f1e0a9c55')
ID_FIELD = 'id'


def point_id(document_id: str) -> str:
    """The point id (a UUID string) of a document id."""
    return str(uuid.uuid5(POINT_NAMESPACE, str(document_id)))


@dataclass(frozen=True)
class Point:
    """One stored item: `vector` is [dim] (one vector) or [tokens, dim] (a late-interaction page)."""

    document_id: str
    vector: np.ndarray
    payload: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        return point_id(self.document_id)

    def full_payload(self) -> dict:
        return {**self.payload, ID_FIELD: self.document_id}


@dataclass(frozen=True)
class Hit:
    """One search result: the document's id, the engine's score (cosine and dot: a similarity, higher is
    closer; euclidean: a distance, lower is closer; MaxSim: a sum of similarities) and its payload."""

    document_id: str
    score: float
    payload: dict | None = None


def hit_from(point_id_: object, score: float, payload: dict | None) -> Hit:
    payload = dict(payload or {})
    document_id = payload.pop(ID_FIELD, None)
    return Hit(str(document_id if document_id is not None else point_id_), float(score), payload)
