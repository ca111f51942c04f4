"""Client errors in a replica's log (serving/replica/error_logs.py): one WARNING line without a traceback, thinned
per kind; server faults keep Jina's ERROR with the traceback. Logged as Jina's worker logs an endpoint's
exception, through a real JinaLogger of the runtime's name."""

import logging
import types

import pytest
from jina.logging.logger import JinaLogger

from clipserve.errors import InvalidParameterError, OverloadedError, WeightsUnavailableError
from clipserve.serving.jina.compat import worker_logger
from clipserve.serving.replica.error_logs import ClientErrorFilter, is_client_error, quiet_client_errors


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def log_as_jina_does(logger: JinaLogger, error: Exception) -> None:
    """What Jina 3.34's WorkerRequestHandler does with an exception an endpoint raised."""
    try:
        raise error
    except Exception as ex:
        logger.error(f'{ex!r}\n add "--quiet-error" to suppress the exception details', exc_info=True)


@pytest.fixture
def jina_logger():
    logger = JinaLogger('clip_t/rep-0')
    records = Records()
    logger.logger.addHandler(records)
    clock = Clock()
    logger.logger.addFilter(ClientErrorFilter(every=5.0, clock=clock))
    yield logger, records.records, clock
    logger.logger.removeHandler(records)
    logger.logger.filters.clear()


def overloaded() -> OverloadedError:
    return OverloadedError('overloaded: 64 requests in flight on this replica', 'max_requests', 1.0)


def test_refusals_are_one_warning_line_without_traceback_then_thinned_with_a_count(jina_logger):
    logger, records, clock = jina_logger
    for _ in range(50):
        log_as_jina_does(logger, overloaded())
    assert len(records) == 1
    first = records[0]
    assert first.levelno == logging.WARNING and first.exc_info is None and first.exc_text is None
    assert first.getMessage() == 'OverloadedError (overloaded): overloaded: 64 requests in flight on this replica'
    clock.now += 5.0
    log_as_jina_does(logger, overloaded())
    assert len(records) == 2
    assert records[1].getMessage().endswith('(and 49 more overloaded in the last 5s)')


def test_each_kind_is_thinned_on_its_own(jina_logger):
    logger, records, _ = jina_logger
    log_as_jina_does(logger, overloaded())
    log_as_jina_does(logger, InvalidParameterError('minibatch_size: must be a positive integer, got -1'))
    log_as_jina_does(logger, overloaded())
    assert [r.getMessage().split(' ')[0] for r in records] == ['OverloadedError', 'InvalidParameterError']


@pytest.mark.parametrize('error', [RuntimeError('model thread died'), WeightsUnavailableError('no cached copy')])
def test_server_faults_keep_error_and_traceback_every_time(jina_logger, error):
    logger, records, _ = jina_logger
    for _ in range(3):
        log_as_jina_does(logger, error)
    assert len(records) == 3
    assert all(r.levelno == logging.ERROR and r.exc_info is not None for r in records)


def test_which_errors_are_the_clients():
    assert is_client_error(overloaded()) and is_client_error(InvalidParameterError('x'))
    assert not is_client_error(WeightsUnavailableError('x')) and not is_client_error(ValueError('x'))
    assert not is_client_error(None)


def test_the_filter_goes_on_the_logger_jina_names_after_the_runtime_once():
    executor = types.SimpleNamespace(runtime_args=types.SimpleNamespace(name='clip_i/rep-1'))
    logger = worker_logger(executor)
    assert logger is JinaLogger('clip_i/rep-1').logger  # the one Jina's worker logs endpoint errors with
    try:
        installed = quiet_client_errors(logger)
        assert quiet_client_errors(logger) is installed
        assert [f for f in logger.filters if isinstance(f, ClientErrorFilter)] == [installed]
    finally:
        logger.filters.clear()
    assert worker_logger(types.SimpleNamespace(runtime_args=types.SimpleNamespace())) is None
