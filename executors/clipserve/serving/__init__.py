"""Jina glue, split by process: gateway/ and replica/, which meet only in jina/ (the door).

`schemas.py` is the public name of the DocArray v2 documents clients import.
"""
