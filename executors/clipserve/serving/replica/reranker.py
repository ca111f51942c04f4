"""CrossEncoderRanker: a cross-encoder reranker as a Jina executor (DocArray v1 documents).

`/rerank` takes query documents with their candidates as matches (texts) and scores every (query, candidate)
pair with the model (engine/rerank.py): each match gets `scores['relevance_score']` (the sigmoid of the
model's logit: a pair scores the same whatever else is in the request) and `scores['raw_score']` (the
logit), and the matches come back sorted by it, cut to `top_n`. Parameters: `top_n`, `max_length`,
`truncation_direction` (`right` or `left`), `truncate` (false: a pair longer than max_length is an error naming
it). Every other path passes through untouched, so it sits in any Flow (flows/rerank.yml,
flows/search-rerank.yml); the gateway's `/v1/rerank`, `/rerank` and `/v2/rerank` call it.
"""

from __future__ import annotations

import time
from dataclasses import replace

from clipserve.backends import create_cross_encoder, rerank_check
from clipserve.backends.cross_encoder import RerankOptions
from clipserve.config.parameters import check_bool, check_int
from clipserve.config.reranker_settings import DIRECTIONS, reranker_settings
from clipserve.engine.rerank import RerankPipeline
from clipserve.errors import InvalidDocumentError, InvalidParameterError, UnknownModelError
from clipserve.models.cross_encoder import PairTokenizer, resolve_cross_encoder
from clipserve.serving.jina.api import JINA_ARGUMENTS, requests
from clipserve.serving.jina.endpoints import INFO_ENDPOINT, READY_ENDPOINT, TOKEN_COUNT_TAG
from clipserve.serving.replica.admitted import AdmittedExecutor
from clipserve.serving.replica.documents import ready_report, set_score

RERANK_ENDPOINT = '/rerank'


def rerank_options(parameters: dict | None) -> dict:
    """A /rerank request's options, checked: top_n, max_length, truncation_direction, truncate."""
    parameters = parameters or {}
    top_n = parameters.get('top_n')
    max_length = parameters.get('max_length')
    direction = parameters.get('truncation_direction', 'right')
    if direction not in DIRECTIONS:
        raise InvalidParameterError(f"parameter 'truncation_direction' must be right or left, got {direction!r}")
    return {
        'top_n': None if top_n is None else check_int('top_n', top_n),
        'max_length': None if max_length is None else check_int('max_length', max_length, minimum=4),
        'direction': direction,
        'truncate': check_bool('truncate', parameters.get('truncate', True)),
    }


class CrossEncoderRanker(AdmittedExecutor):
    """Scores each query's matches with a cross-encoder and sorts them (see the module's docstring)."""

    def __init__(self, **kwargs):
        super().__init__(**{k: kwargs.pop(k) for k in JINA_ARGUMENTS if k in kwargs})
        started = time.perf_counter()
        self.settings = settings = reranker_settings(**kwargs)
        if not settings.name:
            raise UnknownModelError(
                'name a reranker: the setting `name` (CLIPSERVE_RERANK_MODEL), a hub id or a folder'
            )
        spec = resolve_cross_encoder(settings.name)
        options = RerankOptions(device=settings.device or 'cpu', dtype=settings.dtype, num_threads=settings.threads)
        self.encoder = create_cross_encoder(settings.backend, spec, options, settings.model_path)
        self.precision = self._check_precision(spec, options)
        self.model_label = settings.name
        self.metrics = self.make_metrics()
        self.admit_requests(settings)
        self.pipeline = RerankPipeline(
            self.encoder,
            settings.minibatch_size,
            batch_wait=settings.batch_wait_ms / 1000,
            others_in_flight=lambda: self.admission.requests > 1,
        )
        self.pipeline.score('warm up', ['a first pair to load everything'])
        self.encoder.model_calls = 0
        self.load_seconds = time.perf_counter() - started
        self.logger.info(f'ready in {self.load_seconds:.1f}s: reranker {self.encoder.describe()}')

    def _check_precision(self, spec, options) -> str:
        """A precision other than fp32 is measured against fp32 on this CPU before it serves
        (backends/rerank_check.py): refused when asked for and drifting, replaced by fp32 when `auto` chose it."""
        if self.encoder.dtype == 'fp32' or self.encoder.device.startswith('cuda'):
            return self.encoder.dtype
        fp32_options = replace(options, dtype='fp32')
        reference = create_cross_encoder(self.settings.backend, spec, fp32_options, self.settings.model_path)
        report = rerank_check.check_precision(PairTokenizer(self.encoder.spec), self.encoder, reference)
        if not report.failures:
            reference.close()
            line = report.describe()
        elif rerank_check.forced():
            reference.close()
            line = f'{report.describe()}; SERVED ANYWAY ({rerank_check.FORCE_ENV}=1): {"; ".join(report.failures)}'
        elif options.dtype in (None, '', 'auto'):
            self.encoder.close()
            self.encoder = reference
            line = f'fp32: auto chose {report.dtype}, which failed its check ({"; ".join(report.failures)})'
        else:
            reference.close()
            raise rerank_check.refusal(report)
        self.logger.info(f'precision: {line}')
        return line

    @requests(on=READY_ENDPOINT)
    def ready(self, **kwargs):
        shard = int(getattr(self.runtime_args, 'shard_id', 0) or 0)
        shards = int(getattr(self.runtime_args, 'shards', 1) or 1)
        admission = self.admission_summary(self.settings)
        return ready_report(shard, shards, self._draining, admission)

    @requests(on=INFO_ENDPOINT)
    def info(self, **kwargs):
        return {
            'reranker': {
                'model': self.settings.name,
                'backend': self.encoder.name,
                'device': self.encoder.device,
                'dtype': self.encoder.dtype,
                'precision': self.precision,
                'max_length': self.settings.max_length or self.encoder.spec.max_length,
                'model_calls': self.encoder.model_calls,
                'requests_in_flight': self.admission.requests,
                'load_seconds': round(self.load_seconds, 3),
            }
        }

    @requests(on=RERANK_ENDPOINT)
    def rerank(self, docs, parameters: dict | None = None, **kwargs):
        options = rerank_options(parameters)
        deadline = self._deadline(parameters, docs)
        max_length = options['max_length'] or self.settings.max_length
        for query in docs:
            matches = list(query.matches)
            missing = [(m.id, 'has no text: this reranker scores texts') for m in matches if not m.text]
            if not query.text:
                missing.insert(0, (query.id, 'the query has no text: this reranker scores texts'))
            if missing:
                raise InvalidDocumentError(missing, 'reranked')
            scores = self.pipeline.score(
                query.text,
                [m.text for m in matches],
                max_length,
                options['direction'],
                options['truncate'],
                request=object(),  # each query's pairs are scheduled together, fairly against others'
                deadline=deadline,
                names=[m.id for m in matches],
            )
            for match, raw, relevance in zip(matches, scores.raw, scores.relevance):
                set_score(match, 'relevance_score', float(relevance), 'sigmoid')
                set_score(match, 'raw_score', float(raw), 'logit')
            ordered = sorted(range(len(matches)), key=lambda i: -float(scores.raw[i]))
            query.matches = [matches[i] for i in ordered[: options['top_n']]]
            query.tags[TOKEN_COUNT_TAG] = scores.tokens
        return docs

    def close(self) -> None:
        self.pipeline.close()
        super().close()
