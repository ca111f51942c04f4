"""The command line's one error: something the user can fix, said in one line (exit status 2)."""


class UsageError(Exception):
    """A bad flag, a model name that does not exist, a missing file: printed as `clipserve <command>: <message>`."""
