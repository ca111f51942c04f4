import pytest

from clipserve.config.parameters import check_int, env_or_default, request_options
from clipserve.errors import InvalidParameterError


def test_defaults_and_overrides():
    assert request_options({}, '@r').access_paths == '@r'
    assert request_options({'access_paths': '@c'}, '@r').access_paths == '@c'
    # the legacy name wins, as in clip-as-service
    assert request_options({'access_paths': '@c', 'traversal_paths': '@m'}, '@r').access_paths == '@m'
    assert request_options({'drop_image_content': True}, '@r').drop_image_content is True
    assert request_options(None, '@r').drop_image_content is False


def test_unknown_parameters_are_ignored():
    assert request_options({'limit': 10, 'model_name': 'x', 'whatever': [1]}, '@r').access_paths == '@r'


@pytest.mark.parametrize(
    'params, key',
    [
        ({'drop_image_content': 'yes'}, 'drop_image_content'),
        ({'drop_image_content': 1}, 'drop_image_content'),
        ({'access_paths': 3}, 'access_paths'),
        ({'access_paths': ''}, 'access_paths'),
        ({'traversal_paths': None}, 'traversal_paths'),
    ],
)
def test_wrong_types_name_the_parameter(params, key):
    with pytest.raises(InvalidParameterError, match=key):
        request_options(params, '@r')


def test_integers_accept_protobuf_floats_only_when_whole():
    assert check_int('minibatch_size', 8.0) == 8
    for bad in (0, -1, 2.5, 'x', True, None):
        with pytest.raises(InvalidParameterError, match='minibatch_size'):
            check_int('minibatch_size', bad)


def test_unexpanded_env_placeholders_fall_back():
    assert env_or_default('$CLIPSERVE_MODEL', 'd') == 'd'
    assert env_or_default('', 'd') == 'd'
    assert env_or_default(None, 'd') == 'd'
    assert env_or_default('ViT-B-32::random', 'd') == 'ViT-B-32::random'


def test_thread_budget_splits_cores_between_replicas(monkeypatch):
    import os

    from clipserve.serving.replica.executors import thread_budget

    monkeypatch.delenv('OMP_NUM_THREADS', raising=False)
    cores = len(os.sched_getaffinity(0))
    assert thread_budget(1) == cores
    assert thread_budget(2) == max(1, cores // 2)
    assert thread_budget(64) == 1
    monkeypatch.setenv('OMP_NUM_THREADS', '3')
    assert thread_budget(2) is None  # the operator decides
