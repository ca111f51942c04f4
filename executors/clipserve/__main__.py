"""`python -m clipserve ...`: the command line (clipserve/cli)."""

from clipserve.cli import main

if __name__ == '__main__':
    main()
