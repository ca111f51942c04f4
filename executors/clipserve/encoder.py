"""CLIPEncoder: clip-as-service's executor, endpoint for endpoint.

A bare `@requests` makes `encode` the catch-all, so `/`, `/encode`, `/encode/<model>`, `/index`,
`/search` and any other unbound path all encode, exactly as legacy Flows and clip-client expect.
`/rank` (and `/rank/<model>`) scores matches, so single-executor legacy Flows keep working.
"""

from docarray import DocumentArray
from jina import requests

from clipserve.executor_base import CLIPExecutorBase
from clipserve.options import request_options


class CLIPEncoder(CLIPExecutorBase):
    """Texts and images to CLIP embeddings (float32, unnormalised), written onto the documents in place."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._bind_model_endpoints('/encode', '/rank')

    @requests
    def encode(self, docs: DocumentArray, parameters: dict | None = None, **kwargs):
        options = request_options(parameters, self.access_paths, self.logger)
        selected = docs[options.access_paths]
        self.metrics.docs(self.backend.model_name, 'encode', len(selected))
        if options.token_counts:  # only then: subclasses that override encode_documents keep working
            self.encode_documents(selected, options.drop_image_content, count_tokens=True)
        else:
            self.encode_documents(selected, options.drop_image_content)
        return docs

    @requests(on='/encode')
    def encode_endpoint(self, docs: DocumentArray, parameters: dict | None = None, **kwargs):
        """`/encode` bound by name too, so `/encode/<model>` can be, and multi-model Flows can route it."""
        return self.encode(docs, parameters)
