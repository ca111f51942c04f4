"""The HTTP port's service routes, as TEI and Infinity have them: `GET /` (what this server is: name, version,
readiness, models, links), `GET /health` (the Flow's readiness, as `/readyz`: ReadinessMiddleware answers both)
and `GET /metrics` (the gateway's Prometheus metrics, where the Flow has monitoring on); and `/openapi.json`
(so the `/docs` page) describing clipserve's routes next to Jina's (openapi_schema.py).
"""

from __future__ import annotations

import asyncio
import json

from clipserve.serving.gateway import openapi_schema
from clipserve.serving.gateway.openai_api import EMBEDDINGS_PATH, MODELS_PATH, PLAYGROUND_PATH, RANK_PATH, SEARCH_PATH
from clipserve.serving.gateway.readiness import LIVE_PATH, READY_PATH

INDEX_PATH, HEALTH_PATH, METRICS_PATH, OPENAPI_PATH = '/', '/health', '/metrics', '/openapi.json'
MODELS_WAIT_SECONDS = 2.0  # GET / lists the models when the Flow tells them this fast, else none


async def _answer(send, status: int, body: bytes, content_type: bytes, head: bool = False) -> None:
    await send(
        {
            'type': 'http.response.start',
            'status': status,
            'headers': [
                (b'content-type', content_type),
                (b'content-length', str(len(body)).encode()),
                (b'cache-control', b'no-store'),
            ],
        }
    )
    await send({'type': 'http.response.body', 'body': b'' if head else body})


def _json(payload) -> bytes:
    return json.dumps(payload).encode()


class ServiceRoutes:
    """ASGI: GET / and GET /metrics here, /openapi.json extended; every other request goes to `app`."""

    def __init__(self, app, readiness, flow=None, registry=None, playground: bool = False, openapi_app=None):
        self.app = app
        self.readiness = readiness
        self.flow = flow  # openai_gateway.FlowCalls where the /v1 routes are on, else None
        self.registry = registry  # the gateway's Prometheus registry (monitoring on), else None
        self.playground = playground
        if openapi_app is not None:
            describe_routes(openapi_app, playground, v1=flow is not None)

    async def __call__(self, scope, receive, send):
        method, path = scope.get('method'), scope.get('path')
        if scope['type'] != 'http' or method not in ('GET', 'HEAD') or path not in (INDEX_PATH, METRICS_PATH):
            return await self.app(scope, receive, send)
        head = method == 'HEAD'
        if path == METRICS_PATH:
            return await self._metrics(send, head)
        return await _answer(send, 200, _json(await self.index()), b'application/json', head)

    async def index(self) -> dict:
        from clipserve.config.version import __version__

        links = {
            'openapi': OPENAPI_PATH,
            'docs': '/docs',
            'ready': READY_PATH,
            'live': LIVE_PATH,
            'health': HEALTH_PATH,
            'metrics': METRICS_PATH,
        }
        models = []
        if self.flow is not None:
            links.update(models=MODELS_PATH, embeddings=EMBEDDINGS_PATH, rank=RANK_PATH, search=SEARCH_PATH)
            try:
                served = await asyncio.wait_for(self.flow.models(), MODELS_WAIT_SECONDS)
                models = [m.name for m in served]
            except Exception:  # not ready, an executor down: the index still answers
                models = []
        if self.playground:
            links['playground'] = PLAYGROUND_PATH
        return {
            'name': 'clipserve',
            'version': __version__,
            'ready': bool(self.readiness.ready),
            'models': models,
            'links': links,
        }

    async def _metrics(self, send, head: bool) -> None:
        if self.registry is None:
            error = {
                'error': {
                    'message': "this Flow's gateway has no metrics: serve it with monitoring on (flows/monitoring.yml, "
                    "or `monitoring: true` under the Flow's `with:`)",
                    'type': 'not_found_error',
                    'param': None,
                    'code': 'monitoring_off',
                }
            }
            return await _answer(send, 404, _json(error), b'application/json', head)
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return await _answer(send, 200, generate_latest(self.registry), CONTENT_TYPE_LATEST.encode(), head)


def describe_routes(app, playground: bool, v1: bool) -> None:
    """Jina's FastAPI app's `/openapi.json` (and so its `/docs` page) with clipserve's routes in it."""
    original = app.openapi
    extended = {}

    def openapi():
        if not extended:
            extended.update(openapi_schema.extend(original(), playground, v1))
        return extended

    app.openapi = openapi
