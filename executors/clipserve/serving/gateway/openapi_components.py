"""The request and answer schemas of clipserve's HTTP routes (OpenAPI 3.1 / JSON Schema components), as the
parsers read the requests (openai_api.py, search_api.py, rerank_api.py) and openai_answers.py writes the
answers; openapi_schema.py puts them in the paths."""

from __future__ import annotations

from clipserve.config.parameters import MULTI_VECTOR_PARAMETER


def ref(name: str) -> dict:
    return {'$ref': f'#/components/schemas/{name}'}


_TEXT_ITEM = {
    'type': 'object',
    'description': 'a text',
    'properties': {'type': {'const': 'text'}, 'text': {'type': 'string'}},
    'required': ['text'],
}
_IMAGE_ITEM = {
    'type': 'object',
    'description': 'an image: a data URI, base64 bytes, or an http(s) URL (fetched only where the operator allows)',
    'properties': {'image': {'type': 'string'}},
    'required': ['image'],
}
_IMAGE_URL_PART = {
    'type': 'object',
    'description': "OpenAI's content part",
    'properties': {
        'type': {'const': 'image_url'},
        'image_url': {'type': 'object', 'properties': {'url': {'type': 'string'}}, 'required': ['url']},
    },
    'required': ['image_url'],
}
_USAGE = {
    'type': 'object',
    'properties': {'prompt_tokens': {'type': 'integer'}, 'total_tokens': {'type': 'integer'}},
    'required': ['prompt_tokens', 'total_tokens'],
}
_MODEL_NAME = {'type': 'string', 'description': "one of the Flow's models (GET /v1/models); default: its default"}

SCHEMAS = {
    'Item': {
        'description': 'A text or an image. A string is an image when it is a data:image URI or an http(s) URL '
        '(or when `modality` says so), else a text.',
        'anyOf': [{'type': 'string'}, _TEXT_ITEM, _IMAGE_ITEM, _IMAGE_URL_PART],
    },
    'Modality': {'type': 'string', 'enum': ['text', 'image'], 'description': 'what every string of the request is'},
    'Usage': _USAGE,
    'Error': {
        'type': 'object',
        'properties': {
            'error': {
                'type': 'object',
                'properties': {
                    'message': {'type': 'string', 'description': 'what went wrong, naming the input, and the fix'},
                    'type': {'type': 'string'},
                    'param': {'type': ['string', 'null']},
                    'code': {'type': ['string', 'null']},
                    'items': {
                        'type': 'array',
                        'description': 'when items of the request failed: each by its position, so a client can '
                        'send the others again without reading the message',
                        'items': {
                            'type': 'object',
                            'properties': {
                                'index': {'type': 'integer'},
                                'param': {'type': 'string'},
                                'message': {'type': 'string'},
                                'code': {'type': ['string', 'null']},
                            },
                            'required': ['index', 'param', 'message'],
                        },
                    },
                },
                'required': ['message', 'type'],
            }
        },
        'required': ['error'],
    },
    'ModelList': {
        'type': 'object',
        'properties': {
            'object': {'const': 'list'},
            'capabilities': {
                'type': 'object',
                'properties': {
                    'search': {'type': 'boolean', 'description': 'the Flow has an index: POST /v1/search'},
                    'rerankers': {'type': 'array', 'items': {'type': 'string'}},
                },
            },
            'data': {
                'type': 'array',
                'items': {
                    'type': 'object',
                    'properties': {
                        'id': {'type': 'string'},
                        'object': {'const': 'model'},
                        'created': {'type': 'integer'},
                        'owned_by': {'type': 'string'},
                        'embedding_dimensions': {'type': 'integer'},
                        'modalities': {'type': 'array', 'items': ref('Modality')},
                        'aliases': {'type': 'array', 'items': {'type': 'string'}},
                        'default': {'type': 'boolean'},
                        MULTI_VECTOR_PARAMETER: {'type': 'boolean'},
                    },
                    'required': ['id', 'object', 'embedding_dimensions', 'modalities', 'default'],
                },
            },
        },
        'required': ['object', 'data'],
    },
    'EmbeddingsRequest': {
        'type': 'object',
        'properties': {
            'input': {'anyOf': [ref('Item'), {'type': 'array', 'items': ref('Item'), 'minItems': 1}]},
            'model': _MODEL_NAME,
            'encoding_format': {'type': 'string', 'enum': ['float', 'base64'], 'default': 'float'},
            'dimensions': {'type': 'integer', 'description': "only the model's own size (CLIP is not truncated)"},
            'modality': ref('Modality'),
            'return_multivector': {'type': 'boolean', 'description': 'late-interaction models: [tokens, dim] each'},
            'user': {'type': 'string'},
        },
        'required': ['input'],
    },
    'EmbeddingsResponse': {
        'type': 'object',
        'properties': {
            'object': {'const': 'list'},
            'model': {'type': 'string'},
            'usage': ref('Usage'),
            'data': {
                'type': 'array',
                'items': {
                    'type': 'object',
                    'properties': {
                        'object': {'const': 'embedding'},
                        'index': {'type': 'integer'},
                        'embedding': {
                            'description': 'L2-normalised float32: numbers, or base64 of little-endian bytes',
                            'anyOf': [{'type': 'array', 'items': {}}, {'type': 'string'}],
                        },
                        'shape': {'type': 'array', 'items': {'type': 'integer'}},
                    },
                    'required': ['object', 'index', 'embedding'],
                },
            },
        },
        'required': ['object', 'data', 'model', 'usage'],
    },
    'RankRequest': {
        'type': 'object',
        'properties': {
            'query': ref('Item'),
            'documents': {'type': 'array', 'items': ref('Item'), 'minItems': 1},
            'candidates': {'type': 'array', 'items': ref('Item'), 'description': 'another name for documents'},
            'top_n': {'type': 'integer', 'minimum': 1},
            'model': _MODEL_NAME,
            'modality': ref('Modality'),
        },
        'required': ['query'],
    },
    'RankResponse': {
        'type': 'object',
        'properties': {
            'object': {'const': 'rerank'},
            'model': {'type': 'string'},
            'usage': ref('Usage'),
            'results': {
                'type': 'array',
                'description': 'best first',
                'items': {
                    'type': 'object',
                    'properties': {
                        'index': {'type': 'integer', 'description': 'the position in documents'},
                        'relevance_score': {'type': 'number'},
                        'clip_score': {'type': 'number', 'description': "softmax of 100 x cosine, as /rank's"},
                        'clip_score_cosine': {'type': 'number'},
                        'siglip_score': {'type': 'number'},
                        'maxsim_score': {'type': 'number'},
                    },
                    'required': ['index', 'relevance_score'],
                },
            },
        },
        'required': ['object', 'model', 'results', 'usage'],
    },
    'SearchRequest': {
        'type': 'object',
        'description': 'exactly one of query and vector',
        'properties': {
            'query': ref('Item'),
            'vector': {'type': 'array', 'items': {'type': 'number'}, 'minItems': 1},
            'top_k': {'type': 'integer', 'minimum': 1, 'maximum': 1000, 'default': 10},
            'filter': {'type': 'object', 'description': "clip-as-service's (AnnLite's) filter syntax or Qdrant's"},
            'return_payload': {
                'anyOf': [
                    {'type': 'boolean'},
                    {'type': 'array', 'items': {'type': 'string', 'enum': ['text', 'uri', 'tags']}},
                ],
                'default': True,
            },
            'ef_search': {'type': 'integer', 'minimum': 1},
            'rerank': {
                'anyOf': [
                    {'type': 'boolean'},
                    {
                        'type': 'object',
                        'properties': {'model': {'type': 'string'}, 'top_n': {'type': 'integer', 'minimum': 1}},
                    },
                ],
                'description': "rerank the candidates' captions with the Flow's cross-encoder",
            },
            'model': _MODEL_NAME,
            'modality': ref('Modality'),
        },
    },
    'SearchResponse': {
        'type': 'object',
        'properties': {
            'object': {'const': 'list'},
            'model': {'type': 'string'},
            'metric': {'type': ['string', 'null'], 'enum': ['cosine', 'inner_product', 'euclidean', 'maxsim', None]},
            'usage': ref('Usage'),
            'results': {
                'type': 'array',
                'description': 'best first',
                'items': {
                    'type': 'object',
                    'properties': {
                        'id': {'type': 'string'},
                        'score': {'type': 'number', 'description': 'a similarity: larger is closer'},
                        'rerank_score': {'type': 'number'},
                        'text': {'type': 'string'},
                        'uri': {'type': 'string'},
                        'tags': {'type': 'object'},
                    },
                    'required': ['id', 'score'],
                },
            },
        },
        'required': ['object', 'model', 'results', 'usage'],
    },
    'RerankRequest': {
        'type': 'object',
        'description': "Cohere's and Jina's body (documents), or text-embeddings-inference's (texts)",
        'properties': {
            'query': {'type': 'string'},
            'documents': {
                'type': 'array',
                'items': {
                    'anyOf': [
                        {'type': 'string'},
                        {'type': 'object', 'properties': {'text': {'type': 'string'}}, 'required': ['text']},
                    ]
                },
            },
            'texts': {'type': 'array', 'items': {'type': 'string'}},
            'model': {'type': 'string'},
            'top_n': {'type': 'integer', 'minimum': 1},
            'return_documents': {'type': 'boolean'},
            'max_tokens_per_doc': {'type': 'integer'},
            'max_length': {'type': 'integer'},
            'truncate': {'type': 'boolean'},
            'truncation_direction': {'type': 'string', 'enum': ['right', 'left', 'Right', 'Left']},
            'raw_scores': {'type': 'boolean'},
            'return_text': {'type': 'boolean'},
        },
        'required': ['query'],
    },
    'RerankResponse': {
        'description': "Cohere's and Jina's answer, or (to a body with texts) TEI's list",
        'anyOf': [
            {
                'type': 'object',
                'properties': {
                    'id': {'type': 'string'},
                    'model': {'type': 'string'},
                    'results': {
                        'type': 'array',
                        'items': {
                            'type': 'object',
                            'properties': {
                                'index': {'type': 'integer'},
                                'relevance_score': {'type': 'number'},
                                'document': {'type': 'object', 'properties': {'text': {'type': 'string'}}},
                            },
                            'required': ['index', 'relevance_score'],
                        },
                    },
                    'usage': {'type': 'object'},
                    'meta': {'type': 'object'},
                },
                'required': ['results'],
            },
            {
                'type': 'array',
                'items': {
                    'type': 'object',
                    'properties': {
                        'index': {'type': 'integer'},
                        'score': {'type': 'number'},
                        'text': {'type': 'string'},
                    },
                    'required': ['index', 'score'],
                },
            },
        ],
    },
    'Status': {'type': 'object', 'properties': {'status': {'type': 'string'}}, 'required': ['status']},
    'Index': {
        'type': 'object',
        'properties': {
            'name': {'const': 'clipserve'},
            'version': {'type': 'string'},
            'ready': {'type': 'boolean'},
            'models': {'type': 'array', 'items': {'type': 'string'}},
            'links': {'type': 'object', 'additionalProperties': {'type': 'string'}},
        },
        'required': ['name', 'version', 'links'],
    },
}
