"""The DocArray v2 documents clients import to build requests: `from clipserve.serving.schemas import ClipDoc`.

A stable public name for serving/jina/schemas.py (docarray and pydantic only, nothing of Jina).
"""

from clipserve.serving.jina.schemas import (
    ClipDoc,
    ClipDocs,
    ClipMatch,
    ClipMatches,
    ClipQueries,
    ClipQuery,
    ReadyReport,
    ReadyReports,
)

__all__ = ['ClipDoc', 'ClipDocs', 'ClipMatch', 'ClipMatches', 'ClipQueries', 'ClipQuery', 'ReadyReport', 'ReadyReports']
