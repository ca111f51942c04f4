"""The gateway's `auth` mode: its argument when given (an argument beats the environment, as every setting),
else CLIPSERVE_AUTH, else `required`; flows/auth.yml names the variable, so `CLIPSERVE_AUTH=off` still opts
out of it."""

import pytest

from clipserve.errors import ClipServeError
from clipserve.serving.gateway.auth import auth_mode


@pytest.mark.parametrize(
    'argument, environ, mode',
    [
        (None, {}, 'required'),
        (None, {'CLIPSERVE_AUTH': 'off'}, 'off'),
        ('optional', {'CLIPSERVE_AUTH': 'off'}, 'optional'),
        ('Off', {'CLIPSERVE_AUTH': 'Off'}, 'off'),  # flows/auth.yml with the variable set: Jina puts its value
        ('$CLIPSERVE_AUTH', {}, 'required'),  # ... and unset: Jina leaves $NAME
        ('', {'CLIPSERVE_AUTH': 'optional'}, 'optional'),
    ],
)
def test_the_argument_wins_then_the_variable_then_required(argument, environ, mode):
    assert auth_mode(argument, environ) == mode


def test_an_unknown_mode_is_refused_naming_both_places():
    with pytest.raises(ClipServeError, match='gateway argument auth or CLIPSERVE_AUTH'):
        auth_mode('sometimes', {})


def test_the_shipped_token_flows_leave_the_mode_to_the_variable():
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2]
    for name in ('auth.yml', 'secure-v2.yml'):
        config = yaml.safe_load((root / 'flows' / name).read_text())
        assert config['gateway']['uses_with']['auth'] == '${{ ENV.CLIPSERVE_AUTH }}'
