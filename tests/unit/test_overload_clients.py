"""The overload benchmark's lean load generator builds its requests right (benchmarks/overload_clients.py);
the benchmark itself drives a real Flow with it."""

from docarray import Document, DocumentArray
from jina.proto import jina_pb2
from jina.types.request.data import DataRequest

from benchmarks.overload_clients import request_bytes


def test_a_lean_request_is_its_templates_documents_with_the_fresh_request_id_merged_on():
    docs = DocumentArray([Document(id='a', text='a caption'), Document(id='b', blob=b'\xff\xd8 not a real jpeg')])
    template = request_bytes(docs, {'drop_image_content': True})
    ids = []
    for request_id in ('first', 'second'):
        fresh = jina_pb2.DataRequestProto()
        fresh.header.request_id = request_id
        request = DataRequest(template + fresh.SerializeToString())
        assert request.header.exec_endpoint == '/' and request.parameters['drop_image_content'] is True
        assert [(d.id, d.text, d.blob) for d in request.docs] == [(d.id, d.text, d.blob) for d in docs]
        ids.append(request.header.request_id)
    assert ids == ['first', 'second']
