"""Token pooling: fewer vectors per page by merging similar ones (hierarchical clustering), for storage.

A ColPali page is ~1,030 vectors of 128 (527 KB in float32); many are near copies (white margins, repeated
background patches). Pooling clusters a page's vectors and keeps each cluster's mean, renormalised: with
`factor` 3 a page keeps `T // 3` vectors, a third of the bytes and of MaxSim's work, at a measured cost in
ranking (benchmarks/late_interaction.py prints the top-10 agreement with the unpooled result;
docs/late-interaction.md).

The clustering is Ward's agglomerative clustering of the unit vectors (the pair of clusters whose merge adds
the least within-cluster squared distance is merged first, until `T // factor` clusters remain); for unit
vectors the squared distance is 2 - 2 x cosine, so it merges by cosine similarity. This is the idea of
colpali-engine's HierarchicalTokenPooler (Ward linkage, cut at `T // pool_factor` clusters, cluster means
renormalised); that one clusters the rows of the cosine-distance matrix with scipy, this one the vectors
themselves, in NumPy only. Merges are greedy on the global minimum, which for Ward (a reducible linkage)
is the same hierarchy the textbook algorithm builds; row minima are cached, so a page costs a few ms per
hundred vectors rather than a full scan per merge.
"""

from __future__ import annotations

import numpy as np


def pool_tokens(vectors: np.ndarray, factor: int) -> np.ndarray:
    """[T, D] vectors -> [max(T // factor, 1), D]: Ward clusters' means, L2-normalised, in first-member order."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2:
        raise ValueError(f'pool_tokens takes [tokens, dim], got shape {vectors.shape}')
    factor = int(factor)
    if factor < 1:
        raise ValueError(f'pool factor must be at least 1, got {factor}')
    count = len(vectors)
    target = max(count // factor, 1)
    if factor == 1 or count <= target:
        return vectors.copy()
    owner = ward_clusters(vectors.astype(np.float64), target)
    labels = np.unique(owner)  # each cluster is named by its first member's index: output in page order
    sums = np.zeros((len(labels), vectors.shape[1]), dtype=np.float64)
    np.add.at(sums, np.searchsorted(labels, owner), vectors)
    norms = np.linalg.norm(sums, axis=1, keepdims=True)
    return (sums / np.where(norms > 0, norms, 1.0)).astype(np.float32)


def ward_clusters(x: np.ndarray, clusters: int) -> np.ndarray:
    """For each row of `x`, the index of the first row of its cluster, once Ward merging leaves `clusters`."""
    n = len(x)
    counts = np.ones(n)
    centroids = x.copy()
    squares = (x * x).sum(1)
    cost = 0.5 * np.maximum(squares[:, None] + squares[None, :] - 2.0 * (x @ x.T), 0.0)  # merge cost of singletons
    np.fill_diagonal(cost, np.inf)
    active = np.ones(n, dtype=bool)
    owner = np.arange(n)
    nearest = cost.argmin(1)
    nearest_cost = cost[np.arange(n), nearest]
    for _ in range(n - clusters):
        i = int(nearest_cost.argmin())
        j = int(nearest[i])
        i, j = min(i, j), max(i, j)  # the merged cluster keeps the smaller index (its first member)
        total = counts[i] + counts[j]
        centroids[i] = (counts[i] * centroids[i] + counts[j] * centroids[j]) / total
        counts[i] = total
        active[j] = False
        owner[owner == j] = i
        cost[j, :] = np.inf
        cost[:, j] = np.inf
        nearest_cost[j] = np.inf
        gaps = ((centroids - centroids[i]) ** 2).sum(1)
        row = counts * total / (counts + total) * gaps
        row[~active] = np.inf
        row[i] = np.inf
        cost[i, :] = row
        cost[:, i] = row
        nearest[i] = int(row.argmin())
        nearest_cost[i] = row[nearest[i]]
        stale = np.flatnonzero(active & ((nearest == i) | (nearest == j)))  # their nearest grew or went away
        stale = stale[stale != i]
        if len(stale):
            nearest[stale] = cost[stale].argmin(1)
            nearest_cost[stale] = cost[stale, nearest[stale]]
        closer = active & (row < nearest_cost)
        closer[i] = False
        nearest[closer] = i
        nearest_cost[closer] = row[closer]
    return owner
