"""Bulk embedding (`python -m clipserve embed`): a whole collection into clip-retrieval's layout, resumably,
on this machine or as Ray Data stages on a cluster, with the server's own models, preprocessing and limits.

It sits below the serving layer, beside it: no Jina, no DocArray (an import-linter contract checks it), and
everything it takes from the rest of clipserve comes through `bridge.py`. The modules, in the order data
flows: readers (inputs and their parts), decode (bytes to pixels, in worker processes), embedders (the
model here, or a Flow via server_client), job (what a shard holds), writers (the layout, atomic shards),
local and ray_engine (who runs it), progress and cli.
"""
