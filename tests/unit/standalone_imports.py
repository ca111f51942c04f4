"""Which third-party packages a clipserve module pulls in by itself, without the package root.

`import clipserve` imports the executors (and so Jina), so the module is imported in a fresh
interpreter under stand-in package objects for `clipserve` and its subpackages: only the module and
the clipserve modules it imports run.
"""

import json
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / 'executors' / 'clipserve'

_CODE = """
import importlib, json, sys, types
before = set(sys.modules)
root = {root!r}
for name in ("clipserve", "clipserve.models", "clipserve.backends"):
    package = types.ModuleType(name)
    package.__path__ = [root + "/" + "/".join(name.split(".")[1:])]
    sys.modules[name] = package
module = importlib.import_module({module!r})
{check}
new = {{m.split(".")[0] for m in set(sys.modules) - before}} - set(sys.stdlib_module_names) - {{"clipserve"}}
print(json.dumps(sorted(new)))
"""


def third_party_imports(module: str, check: str = '') -> set[str]:
    """Top-level non-stdlib modules that importing `module` (then running `check`) loaded."""
    code = _CODE.format(root=str(PACKAGE), module=module, check=check)
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return set(json.loads(result.stdout.strip().splitlines()[-1]))
