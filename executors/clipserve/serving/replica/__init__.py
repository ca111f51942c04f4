"""Each executor's process: the CLIP encoder and ranker, the indexer and the reranker as Jina executors.

It reaches the gateway's code only through serving/jina/ (the endpoints' names, the readiness report).
"""
