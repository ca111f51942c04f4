"""Helpers the tests and the benchmarks share, not shipped: model folders with seeded random weights and the
files their loaders read (model_folders.py), a process's sockets and memory from /proc (procfs.py), and a
bounded load generator (load.py)."""
