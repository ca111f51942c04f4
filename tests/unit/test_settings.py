"""An executor's constructor arguments, checked once into a settings record (no Jina, no model)."""

import pytest

from clipserve.errors import InvalidParameterError
from clipserve.settings import executor_settings, shutdown_seconds


def test_defaults_and_unset_flow_variables_mean_the_default():
    plain = executor_settings()
    from_yaml = executor_settings(
        name='$CLIPSERVE_MODEL',
        device='$CLIPSERVE_DEVICE',
        dtype='',
        backend='$CLIPSERVE_BACKEND',
        model_path='$CLIPSERVE_MODEL_PATH',
    )
    assert plain == from_yaml
    assert (plain.name, plain.backend, plain.device, plain.minibatch_size, plain.batch_requests) == (
        'ViT-B-32::openai',
        'torch',
        None,
        32,
        None,
    )
    assert plain.uri_policy.allow_local_files is False and plain.uri_policy.allow_remote is False
    assert plain.shutdown_grace == 30.0 and plain.served_models == () and plain.warnings == ()


def test_values_from_yaml_strings_are_read_as_their_types():
    settings = executor_settings(
        minibatch_size='8',
        jpeg_draft='true',
        batch_requests='false',
        batch_wait_ms='2',
        allow_remote_uris='true',
        remote_allowed_hosts=['10.0.0.0/8'],
        served_models=['a', 'b'],
    )
    assert settings.minibatch_size == 8 and settings.jpeg_draft is True and settings.batch_requests is False
    assert settings.batch_wait_seconds == 0.002 and settings.uri_policy.allowed_hosts == ('10.0.0.0/8',)
    assert settings.served_models == ('a', 'b')


def test_the_deprecated_name_still_works_and_says_so():
    settings = executor_settings(traversal_paths='@c')
    assert settings.access_paths == '@c' and 'deprecated' in settings.warnings[0]


@pytest.mark.parametrize(
    'arguments, named',
    [
        ({'backend': 'tensorflow'}, 'backend'),
        ({'minibatch_size': 0}, 'minibatch_size'),
        ({'max_image_pixels': 'many'}, 'max_image_pixels'),
        ({'jpeg_draft': 'maybe'}, 'jpeg_draft'),
        ({'access_paths': ''}, 'access_paths'),
        ({'remote_timeout': 'soon'}, 'remote_timeout'),
        ({'shutdown_grace': -1}, 'shutdown_grace'),
        ({'batch_requests': 'sometimes'}, 'batch_requests'),
    ],
)
def test_a_bad_argument_is_an_error_naming_it(arguments, named):
    with pytest.raises(InvalidParameterError, match=named):
        executor_settings(**arguments)


def test_shutdown_grace_from_the_environment_unless_given():
    assert shutdown_seconds(None, {'CLIPSERVE_SHUTDOWN_GRACE': '5'}) == 5.0
    assert shutdown_seconds(0, {'CLIPSERVE_SHUTDOWN_GRACE': '5'}) == 0.0


def test_the_settings_take_exactly_the_executors_arguments_with_the_same_defaults():
    import inspect

    from clipserve.executor_base import CLIPExecutorBase

    executor = {
        k: p.default
        for k, p in inspect.signature(CLIPExecutorBase.__init__).parameters.items()
        if k not in ('self', 'kwargs')
    }
    settings = {k: p.default for k, p in inspect.signature(executor_settings).parameters.items()}
    assert executor == settings


def test_the_model_name_is_parsed_once_and_a_bad_one_is_an_error_before_any_loading():
    settings = executor_settings(name='ViT-B/32')
    assert settings.name == 'ViT-B/32' and str(settings.model) == 'ViT-B-32::openai'
    from clipserve.models.names import parse_model_name

    assert parse_model_name(settings.model) is settings.model  # passed down, not parsed again
    with pytest.raises(InvalidParameterError, match='name'):
        executor_settings(name='::openai')


def test_the_loading_opt_ins_are_off_unless_given():
    plain = executor_settings(trust_remote_code='$CLIPSERVE_TRUST_REMOTE_CODE', truncate_dim='$CLIPSERVE_TRUNCATE_DIM')
    assert plain.trust_remote_code is False and plain.truncate_dim is None
    given = executor_settings(trust_remote_code='true', truncate_dim='256')
    assert given.trust_remote_code is True and given.truncate_dim == 256
    with pytest.raises(InvalidParameterError, match='trust_remote_code'):
        executor_settings(trust_remote_code='yes please')
    with pytest.raises(InvalidParameterError, match='truncate_dim'):
        executor_settings(truncate_dim=0)
