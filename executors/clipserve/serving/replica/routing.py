"""Multi-model routing: which handler of this executor answers `/encode/<model>` and `/rank/<model>`.

clip-client turns `parameters={'model_name': M}` into the endpoint `/encode/M` (or `/rank/M`). In a
Flow serving several models, each executor answers for its own model (under its canonical name, the
name it was configured with, or any alias of it) and passes the others' requests through untouched,
for the executor that serves them. A name no executor serves is an error listing the served models
(clip-as-service silently answered with whatever model it had); the executor with `serve_default`
says so, the others pass it through.

Jina hands a request for an endpoint it has no entry for to the catch-all handler without saying which
endpoint was asked for, so the model in the path would be lost: the endpoint table built here claims
every `/encode/<anything>` path itself and builds its handler from the name.
"""

from __future__ import annotations

from clipserve.errors import UnknownModelError
from clipserve.models.names import canonical
from clipserve.serving.jina.compat import endpoint_handler
from clipserve.serving.jina.endpoints import INFO_ENDPOINT, READY_ENDPOINT

# endpoints every executor keeps, also the extra models' executors (serve_default=False)
ALWAYS_BOUND = (INFO_ENDPOINT, READY_ENDPOINT)


def _pass_through(executor, **kwargs):
    """A request for another model of this Flow: leave the documents as they are."""
    return None


PASS_THROUGH = endpoint_handler(_pass_through)


class ModelRoutes(dict):
    """An endpoint table that also answers `/<endpoint>/<any model>` for the routed endpoints."""

    def __init__(self, table, handlers, make_handler):
        super().__init__(table)
        self._handlers = handlers  # '/encode' -> handler, '/rank' -> handler
        self._make_handler = make_handler

    def _split(self, key):
        if isinstance(key, str):
            for endpoint in self._handlers:
                if key.startswith(endpoint + '/') and len(key) > len(endpoint) + 1:
                    return endpoint, key[len(endpoint) + 1 :]
        return None

    def __contains__(self, key) -> bool:
        return dict.__contains__(self, key) or self._split(key) is not None

    def __missing__(self, key):
        split = self._split(key)
        if split is None:
            raise KeyError(key)
        endpoint, model = split
        return self._make_handler(model, self._handlers[endpoint])


def model_routes(
    requests: dict,
    endpoints: tuple[str, ...],
    model_name: str,
    configured_name: str,
    served_models: list[str],
    serve_default: bool,
) -> ModelRoutes:
    """The endpoint table of an executor serving `model_name`, in a Flow serving `served_models`.

    `requests` is the executor's own table (Jina's `self.requests`); `endpoints` the ones routed by model.
    """
    handlers = {endpoint: requests[endpoint] for endpoint in endpoints}
    kept = requests if serve_default else {k: v for k, v in requests.items() if k in ALWAYS_BOUND}
    served = ', '.join(served_models)
    others = {canonical(m) for m in served_models} - {model_name, None}

    def handler_for(model: str, handler):
        name = canonical(model)
        if name == model_name:  # another spelling of this model: ViT-B/32
            return handler
        if name in others or not serve_default:  # another executor's model; or the default one answers
            return PASS_THROUGH

        def unknown_model(executor, **kwargs):
            raise UnknownModelError(f'model {model!r} is not served by this Flow; served models: {served}')

        return endpoint_handler(unknown_model)

    table = ModelRoutes(kept, handlers, handler_for)
    own = {model_name, configured_name}
    for endpoint, handler in handlers.items():
        for model in own:
            table[f'{endpoint}/{model}'] = handler
        if serve_default:
            for model in others:
                table[f'{endpoint}/{model}'] = PASS_THROUGH
    return table
