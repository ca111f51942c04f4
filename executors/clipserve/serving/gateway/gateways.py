"""The gateways of clipserve's Flows: Jina's gateway plus readiness, limits, the OpenAI routes and a token.

    gateway: {uses: ReadyGateway, py_modules: [clipserve.serving.gateway.gateways], protocol: [...], port: [...]}
    gateway: {uses: ClipServeGateway, py_modules: [clipserve.serving.gateway.gateways], protocol: [...], port: [...]}

ReadyGateway answers "is every copy of every executor up?" on each protocol (see `readiness.py`):
gRPC health service `readiness`, HTTP/WebSocket port `GET /readyz` (200 or 503) and `GET /livez`. It
applies the gateway's limits (limits.py: message and body sizes before anything is read, requests in
flight), serves on its HTTP port the OpenAI-compatible routes `/v1/models`, `/v1/embeddings`, `/v1/rank`
and the page `/playground` (openai_routes.py), and answers an executor's overload or passed deadline on
Jina's HTTP routes with 429 / 504 (statuses.py).

ClipServeGateway adds a shared token, checked on gRPC, HTTP and WebSocket (auth.py).

What a request meets, in order: its size (gRPC message, WebSocket message, HTTP Content-Length and body as
it streams), the token (headers and metadata only), the gateway's bound on requests in flight, then the
routes; on its way to an executor, the replicas' own bound, mirrored (replica_room.py). Health and
readiness checks pass every one of them but the size.

Arguments (`uses_with`; each also a CLIPSERVE_* variable, config/gateway_settings.py): max_request_bytes,
max_body_bytes, max_inputs, max_in_flight, max_stream_requests, retry_after; readiness_interval,
openai_routes, playground;
ClipServeGateway: auth.
"""

from __future__ import annotations

import asyncio
import json

from grpc_health.v1 import health_pb2
from jina.serve.runtimes.gateway.composite import CompositeGateway
from jina.serve.runtimes.servers.grpc import GRPCServer
from jina.serve.runtimes.servers.http import FastAPIBaseServer, HTTPServer
from jina.serve.runtimes.servers.websocket import WebSocketServer

from clipserve.config.gateway_settings import GATEWAY_SETTINGS, gateway_settings
from clipserve.serving.gateway import flow_calls
from clipserve.serving.gateway import limits as limits_
from clipserve.serving.gateway import openai_routes as v1_routes
from clipserve.serving.gateway.auth import (
    OPEN_HTTP_PATHS,
    OPEN_PAGES,
    AuthConfigError,
    TokenInterceptor,
    TokenMiddleware,
    gateway_token,
)
from clipserve.serving.gateway.metrics import GatewayMetrics
from clipserve.serving.gateway.readiness import (
    HEALTH_PATH,
    LIVE_PATH,
    READINESS_SERVICE,
    READY_PATH,
    FlowReadiness,
    grpc_addresses,
)
from clipserve.serving.gateway.replica_room import ReplicaRoom
from clipserve.serving.gateway.service_routes import METRICS_PATH, ServiceRoutes
from clipserve.serving.gateway.statuses import ExecutorErrorStatus
from clipserve.serving.jina.compat import install_grpc_server_defaults
from clipserve.serving.jina.gateway_hooks import (
    add_grpc_interceptors,
    cancel_calls_with_their_requests,
    cap_stream_prefetch,
    fastapi_app,
    screen_executor_sends,
    set_grpc_server_option,
    wrap_app_after_setup,
)

install_grpc_server_defaults()  # before Jina builds the gateway's gRPC server (jina/compat.py)
cancel_calls_with_their_requests()  # a request cancelled at the gateway stops at the executor too (gateway_hooks.py)

# never counted nor refused for load (GET/HEAD): readiness, liveness, Jina's own health check, the page
UNCOUNTED_PATHS = OPEN_HTTP_PATHS + OPEN_PAGES + ('/', METRICS_PATH, '/openapi.json', '/docs', '/redoc')
LIMIT_NAMES = tuple(s.name for s in GATEWAY_SETTINGS if s.name.startswith(('max_', 'retry_')))
READINESS_PATHS = (READY_PATH, HEALTH_PATH, LIVE_PATH)


def uncounted(scope) -> bool:
    return scope['type'] == 'http' and scope.get('method') in ('GET', 'HEAD') and scope.get('path') in UNCOUNTED_PATHS


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else ([value] if value is not None else [])


def listening_summary(host: str | None, protocols, ports, token: str | None) -> str:
    """`gRPC 0.0.0.0:51000, HTTP 0.0.0.0:51001; no token` (the Flow's ready line ends with it)."""
    names = {'GRPC': 'gRPC', 'HTTP': 'HTTP', 'WEBSOCKET': 'WebSocket'}
    labels = [names.get(str(getattr(p, 'name', p)).upper(), str(p)) for p in _as_list(protocols)]
    where = ', '.join(f'{label} {host or "0.0.0.0"}:{port}' for label, port in zip(labels, _as_list(ports)))
    return f'{where}; {"token required" if token else "no token"}'


def open_to_all(host: str | None, token: str | None, ports) -> str | None:
    """The line a gateway logs at start when anyone who can reach it may use it: it listens beyond loopback
    and asks no token."""
    host = host or '0.0.0.0'  # Jina's default
    if token or host in ('127.0.0.1', 'localhost', '::1') or host.startswith('127.'):
        return None
    where = 'every address' if host in ('0.0.0.0', '::', '') else host
    listed = [str(p) for p in _as_list(ports) if p]
    ports = ('ports ' if len(listed) > 1 else 'port ') + ', '.join(listed)
    return (
        f'OPEN: the gateway listens on {where} ({ports}) and asks no token: anyone who can reach it can use '
        'it. Set a token (clipserve serve --token, or flows/auth.yml with CLIPSERVE_AUTH_TOKEN) or listen on '
        'loopback only (--host 127.0.0.1; docs/security.md)'
    )


class ReadinessMiddleware:
    """ASGI: answers GET /readyz and /health (200 ready, 503 not) and GET /livez (200) before Jina's app."""

    def __init__(self, app, readiness: FlowReadiness):
        self.app = app
        self.readiness = readiness

    async def __call__(self, scope, receive, send):
        path = scope.get('path')
        if scope['type'] != 'http' or scope.get('method') not in ('GET', 'HEAD') or path not in READINESS_PATHS:
            return await self.app(scope, receive, send)
        ok = path == LIVE_PATH or self.readiness.ready
        word = ('live' if path == LIVE_PATH else 'ready') if ok else 'not ready'
        body = json.dumps({'status': word}).encode()
        await send(
            {
                'type': 'http.response.start',
                'status': 200 if ok else 503,
                'headers': [
                    (b'content-type', b'application/json'),
                    (b'content-length', str(len(body)).encode()),
                    (b'cache-control', b'no-store'),
                ],
            }
        )
        await send({'type': 'http.response.body', 'body': body if scope.get('method') == 'GET' else b''})


def expose_readiness(server, readiness: FlowReadiness) -> None:
    """The Flow's readiness as the gRPC health service `readiness` of a gRPC server (HTTP and WebSocket
    servers answer it in their ASGI stack: ReadinessMiddleware)."""
    health = server.health_servicer

    async def on_change(ready: bool):
        status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        await health.set(READINESS_SERVICE, status)

    readiness.listeners.append(on_change)
    original = server.setup_server

    async def setup_server():
        await original()
        await on_change(readiness.ready)

    server.setup_server = setup_server


class ReadyGateway(CompositeGateway):
    """Jina's (composite) gateway plus the Flow's readiness on each protocol, probed every `readiness_interval` s,
    the gateway's limits (module docstring), and on the HTTP port the OpenAI-compatible routes and the
    playground (`openai_routes`, `playground`)."""

    def __init__(
        self,
        readiness_interval: float | None = None,
        openai_routes: bool | None = None,
        playground: bool | None = None,
        max_request_bytes: int | None = None,
        max_body_bytes: int | None = None,
        max_inputs: int | None = None,
        max_in_flight: int | None = None,
        max_stream_requests: int | None = None,
        max_queued_large: int | None = None,
        retry_after: float | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        # the arguments are named here for Jina (which passes `uses_with` by name); they are read as one table
        given = dict(locals())
        self.settings = gateway_settings(**{s.name: given[s.name] for s in GATEWAY_SETTINGS})
        cap_stream_prefetch(self.streamer, self.settings.max_stream_requests)
        deployments = grpc_addresses(getattr(self.runtime_args, 'deployments_addresses', None) or '{}')
        self.readiness = FlowReadiness(deployments, interval=self.settings.readiness_interval, log=self.logger)
        self._readiness_task = None
        registry = getattr(self, 'metrics_registry', None)
        self.gateway_metrics = GatewayMetrics(registry)
        self.in_flight = limits_.InFlight(self.settings.max_in_flight, self.settings.retry_after, self.gateway_metrics)
        # a large request that every replica would refuse is refused here, not forwarded (replica_room.py)
        self.replica_room = ReplicaRoom(self.gateway_metrics, self.settings.max_queued_large)
        self.readiness.report_listeners.append(self.replica_room.update)
        screen_executor_sends(self.streamer, self.replica_room)
        self.token = self._token()
        self.openai = None
        if self.settings.openai_routes:
            self.openai = (
                flow_calls.FlowCalls(self.streamer, self.logger),
                v1_routes.OpenAIMetrics(registry),
                self.settings.playground,
            )
        for server in self.servers:
            self._install(server)
        shown = ', '.join(f'{name}={getattr(self.settings, name)}' for name in LIMIT_NAMES)
        self.logger.info(f'gateway limits: {shown}')
        host, ports = getattr(self.runtime_args, 'host', None), getattr(self.runtime_args, 'port', None)
        warning = open_to_all(host, self.token, ports)
        if warning:
            self.logger.warning(warning)
        protocols = getattr(self.runtime_args, 'protocol', None)
        self.readiness.summary = listening_summary(host, protocols, ports, self.token)

    def _token(self) -> str | None:
        """The token to check; None: none (ClipServeGateway checks one)."""
        return None

    def _install(self, server) -> None:
        """Readiness, limits, token and routes on one of Jina's servers, chosen by its type."""
        if isinstance(server, GRPCServer):
            expose_readiness(server, self.readiness)
            replaced = set_grpc_server_option(
                server, 'grpc.max_receive_message_length', self.settings.max_request_bytes
            )
            if replaced not in (None, self.settings.max_request_bytes):
                self.logger.warning(
                    f'grpc_server_options sets grpc.max_receive_message_length={replaced}; '
                    f'the gateway uses its max_request_bytes={self.settings.max_request_bytes}'
                )
            token = [TokenInterceptor(self.token)] if self.token else []
            admission = limits_.AdmissionInterceptor(self.in_flight, self.settings.max_stream_requests)
            add_grpc_interceptors(server, [*token, admission])
        elif isinstance(server, (FastAPIBaseServer, WebSocketServer)):
            wrap_app_after_setup(server, lambda app, s=server: self._asgi(app, s), self.settings.max_request_bytes)
        else:
            raise AuthConfigError(
                f'cannot serve on a {type(server).__name__} server; use the grpc, http or websocket protocol'
            )

    def _asgi(self, jina_app, server):
        """The ASGI stack in front of Jina's app, outermost first: body size, token, admission, readiness,
        the OpenAI routes (HTTP servers), then Jina's app with statuses by error kind."""
        app = ExecutorErrorStatus(jina_app)
        if isinstance(server, HTTPServer):
            flow, metrics, playground = self.openai or (None, None, False)
            if self.openai is not None:
                app = v1_routes.OpenAIRoutes(app, flow, self.settings, metrics, playground, self.logger)
            registry = getattr(self, 'metrics_registry', None)
            app = ServiceRoutes(app, self.readiness, flow, registry, playground, fastapi_app(jina_app))
        app = ReadinessMiddleware(app, self.readiness)
        peer_cap = self.settings.max_stream_requests
        app = limits_.Admission(app, self.in_flight, uncounted, peer_cap, v1_routes.on_arrival)
        if self.token:
            app = TokenMiddleware(app, self.token)
        return limits_.BodyLimit(app, self.settings.max_body_bytes, self.gateway_metrics)

    @property
    def _should_exit(self) -> bool:
        # Jina's composite server counts a server without `should_exit` (gRPC's) as exited, so a
        # gRPC-only composite gateway would stop right after it starts. Here: exit when every server
        # that can tell (HTTP, WebSocket) has exited; a gRPC server runs until the gateway is cancelled.
        told = [server.should_exit for server in self.servers if hasattr(server, 'should_exit')]
        return bool(told) and all(told)

    async def setup_server(self):
        await super().setup_server()
        self._readiness_task = asyncio.create_task(self.readiness.run())

    async def shutdown(self):
        await self.readiness.close()
        if self._readiness_task is not None:
            self._readiness_task.cancel()
        await super().shutdown()


class ClipServeGateway(ReadyGateway):
    """ReadyGateway with the token check installed on each protocol's server (auth.py).

    `auth`: `required` (the default: no token, no start), `optional` (checked when the token is set)
    or `off`; where the argument is not given, `CLIPSERVE_AUTH` in the environment.
    """

    def __init__(self, auth: str | None = None, **kwargs):
        self._auth = auth
        super().__init__(**kwargs)
        if self.token:
            self.logger.info(f'token authentication on for {len(self.servers)} protocol(s)')

    def _token(self) -> str | None:
        return gateway_token(self._auth, self.logger)
