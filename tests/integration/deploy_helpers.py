"""What the deployment tests share: the checkout's paths, the image name the exports use, and running a
command with Jina kept quiet and on this machine."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HUB = ROOT / 'executors' / 'hub'
EXECUTORS = ['CLIPEncoder', 'CLIPRanker']
IMAGE = 'clipserve:cpu-torch'  # a name only: nothing is pulled or run


# Jina posts a telemetry event from every Flow, Executor and Client it starts unless this is set;
# these tests keep all traffic on this machine.
QUIET = {'JINA_OPTOUT_TELEMETRY': '1', 'COLUMNS': '1000', 'NO_VERSION_CHECK': '1'}


def run(args, **kwargs):
    env = {**os.environ, **QUIET, **kwargs.pop('env', {})}
    return subprocess.run(
        [str(a) for a in args],
        cwd=kwargs.pop('cwd', ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=kwargs.pop('timeout', 120),
        **kwargs,
    )
