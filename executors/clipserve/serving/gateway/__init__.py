"""The gateway's process: Jina's gateway extended with readiness, limits, a token and the `/v1` HTTP API.

It reaches the replicas' code only through serving/jina/ (the documents it sends, the endpoints' names).
"""
