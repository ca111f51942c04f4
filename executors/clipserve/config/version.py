"""The package's version, in a module of its own so that any layer can name it without importing the package's
`__init__` (which defines the executors, and would make a circle of every module that reports the version)."""

__version__ = '0.1.0'  # pyproject.toml's `version`
