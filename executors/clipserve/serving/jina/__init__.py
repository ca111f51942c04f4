"""The door both serving processes import Jina and DocArray through: the public API, the reaches into Jina's
internals, the DocArray flavour, the endpoints' names and the documents on the wire.
"""
