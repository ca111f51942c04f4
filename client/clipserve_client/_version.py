"""The installed distribution's version (clipserve-client), for the User-Agent and `__version__`."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version('clipserve-client')
except PackageNotFoundError:  # run from a checkout without installing
    __version__ = '0.1.0+source'
