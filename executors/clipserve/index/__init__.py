"""Vector search: a collection of embeddings with payloads, searched by similarity and filtered by payload.

clipserve writes no index of its own: the engine is Qdrant's, embedded in process (`qdrant-edge-py`,
edge.py) or a Qdrant server or cluster by URL (`qdrant-client`, server.py), both behind one small store
interface (store.py). filters.py reads clip-as-service's (AnnLite's) filter syntax into Qdrant's own;
points.py is what a stored item is. Nothing here knows Jina or DocArray: the indexer executors
(serving/replica/indexer.py) and the bulk loader (jobs/) both use it.
"""
