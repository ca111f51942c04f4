"""Print clipserve's dependencies from pyproject.toml, one requirement a line: the base dependencies, plus
those of the extras named in the arguments (comma- or space-separated). The Dockerfile installs these
before it copies the code, so that a change to the code does not reinstall them.

    python deploy/requirements.py              # the base dependencies (the same for every variant)
    python deploy/requirements.py onnx         # + the onnx extra's

Needs Python 3.11+ (tomllib). On 3.10 it prints nothing: the Dockerfile's install of the package
then installs every dependency itself, in one slower layer.
"""

import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    sys.exit(0)

project = tomllib.loads(Path('pyproject.toml').read_text())['project']
name, optional = project['name'], project.get('optional-dependencies', {})
wanted = [extra for arg in sys.argv[1:] for extra in arg.split(',') if extra]
unknown = sorted(set(wanted) - set(optional))
if unknown:
    sys.exit(f'requirements.py: no extra {", ".join(unknown)} in pyproject.toml (there are: {", ".join(optional)})')
lines, seen = list(project.get('dependencies', [])), set()
while wanted:
    extra = wanted.pop()
    if extra in seen:
        continue
    seen.add(extra)
    for requirement in optional[extra]:
        # an extra naming the project itself (name[other]) brings that other extra's requirements
        if requirement.replace(' ', '').startswith(f'{name}['):
            wanted += requirement.split('[', 1)[1].split(']', 1)[0].split(',')
        else:
            lines.append(requirement)
print('\n'.join(dict.fromkeys(lines)))
