"""Every executor setting from each source: an argument (YAML `with:`, `uses_with`, `--uses-with`: native
values or strings), its environment variable, its default; lists from comma-separated strings; every number
checked (finite, in range); every wrong value an error naming the setting."""

import inspect
import math

import pytest

from clipserve.config.reading import Setting, convert, read_setting
from clipserve.config.settings import EXECUTOR_SETTINGS, executor_settings
from clipserve.errors import InvalidParameterError

SETTINGS = {s.name: s for s in EXECUTOR_SETTINGS}

# a value other than the default for each setting, as (native, as a string)
SAMPLES = {
    'str': ('ViT-B-16::openai', 'ViT-B-16::openai'),
    'int': (7, '7'),
    'float': (2.5, '2.5'),
    'bool': (True, 'true'),
    'list': (('a.example', 'b.example'), 'a.example, b.example'),
    'choice': ('onnx', 'onnx'),
}


def sample(setting: Setting):
    native, text = SAMPLES[setting.kind]
    if setting.kind == 'bool' and setting.default is True:
        return False, 'false'
    if setting.name == 'access_paths':
        return '@c', '@c'
    return native, text


@pytest.mark.parametrize('setting', EXECUTOR_SETTINGS, ids=lambda s: s.name)
def test_each_setting_from_each_source(setting):
    native, text = sample(setting)
    variable = setting.variable
    assert read_setting(setting, None, {}) == setting.default  # nothing given
    assert read_setting(setting, native, {}) == native  # uses_with / --uses-with JSON
    assert read_setting(setting, text, {}) == native  # a YAML or command-line string
    assert read_setting(setting, None, {variable: text}) == native  # the environment variable
    assert read_setting(setting, f'${variable}', {variable: text}) == native  # `${{ ENV.X }}` left unexpanded
    assert read_setting(setting, native, {variable: 'ignored'}) == native  # the argument wins
    assert read_setting(setting, '', {}) == setting.default


@pytest.mark.parametrize('setting', [s for s in EXECUTOR_SETTINGS if s.kind in ('int', 'float')], ids=lambda s: s.name)
def test_every_number_is_checked(setting):
    for bad in ('nan', float('nan'), 'inf', math.inf, 'many', -1, True, [3]):
        with pytest.raises(InvalidParameterError, match=setting.name):
            convert(setting, bad)
    if setting.kind == 'int':
        with pytest.raises(InvalidParameterError, match='integer'):
            convert(setting, 2.5)
    with pytest.raises(InvalidParameterError, match=setting.variable):  # the source is named
        read_setting(setting, None, {setting.variable: 'nan'})


@pytest.mark.parametrize('setting', [s for s in EXECUTOR_SETTINGS if s.kind == 'list'], ids=lambda s: s.name)
def test_a_list_given_as_one_string_is_a_comma_separated_list(setting):
    assert convert(setting, 'ViT-B-32::openai') == ('ViT-B-32::openai',)  # never split into characters
    assert convert(setting, 'a, b,,c ') == ('a', 'b', 'c')
    assert convert(setting, ['a', ' b ']) == ('a', 'b')
    with pytest.raises(InvalidParameterError, match=setting.name):
        convert(setting, {'a': 1})


@pytest.mark.parametrize(
    'setting', [s for s in EXECUTOR_SETTINGS if s.kind in ('bool', 'choice')], ids=lambda s: s.name
)
def test_a_wrong_boolean_or_choice_names_the_setting(setting):
    with pytest.raises(InvalidParameterError, match=setting.name):
        convert(setting, 'sometimes')


def test_every_setting_is_described_and_has_a_variable_and_the_table_is_the_one_list():
    """The replica names no setting itself: every `with:` key but Jina's own goes to the table's loader."""
    from clipserve.serving.replica.clip_replica import CLIPReplica

    assert set(inspect.signature(CLIPReplica.__init__).parameters) == {'self', 'kwargs'}
    for setting in EXECUTOR_SETTINGS:
        assert setting.description.strip() and setting.variable.startswith('CLIPSERVE_')


def test_unknown_arguments_are_refused():
    with pytest.raises(InvalidParameterError, match='minibatch'):
        executor_settings(minibatchsize=4)


def test_clip_as_services_jit_is_accepted_and_ignored_saying_so_when_on():
    """clip-as-service's YAMLs pass `jit` (TorchScript); clipserve runs the model as it is, so the key is taken,
    a warning says it is ignored when it is on, and nothing when it is off."""
    assert 'jit' in executor_settings(jit=True).warnings[0]
    assert executor_settings(jit=False).warnings == executor_settings().warnings
    with pytest.raises(InvalidParameterError, match='jit'):
        executor_settings(jit='sometimes')


def test_the_deprecated_name_still_works_and_says_so():
    settings = executor_settings(traversal_paths='@c')
    assert settings.access_paths == '@c' and 'deprecated' in settings.warnings[0]


def test_the_defaults_and_a_yaml_without_variables_set_agree():
    plain = executor_settings(environ={})
    from_yaml = executor_settings(
        environ={}, name='$CLIPSERVE_MODEL', device='$CLIPSERVE_DEVICE', dtype='', backend='$CLIPSERVE_BACKEND'
    )
    assert plain == from_yaml
    assert (plain.name, plain.backend, plain.minibatch_size, plain.batch_requests) == (
        'ViT-B-32::openai',
        'torch',
        32,
        True,
    )
    assert plain.allow_local_files is False and plain.allow_remote_uris is False and plain.shutdown_grace == 30.0
