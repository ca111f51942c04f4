"""clipserve's own endpoints and the readiness report's wire form, the same in both DocArray flavours.

No DocArray here: the v1 documents (documents.py) and the v2 ones (documents_v2.py) both write the report
as a document whose id starts with REPORT_ID and whose tags hold it; the gateway's probe (readiness.py)
reads it back from whichever documents its Jina parses the answer into.
"""

from __future__ import annotations

INFO_ENDPOINT = '/clipserve/info'
READY_ENDPOINT = '/clipserve/ready'
# a text document's token count, written into its tags when the request asks (options.TOKEN_COUNTS_PARAMETER)
TOKEN_COUNT_TAG = 'clipserve_tokens'
REPORT_ID = 'clipserve-ready-shard-'  # one document per shard: a head polling ALL merges them by id


def ready_report_fields(shard_id: int, shards: int, draining: bool) -> tuple[str, dict]:
    """(document id, tags) of one copy's answer to READY_ENDPOINT."""
    return f'{REPORT_ID}{shard_id}', {'draining': draining, 'shard_id': shard_id, 'shards': shards}


def read_reports(docs) -> list[dict]:
    """The reports in an answer to READY_ENDPOINT (none from an executor that is not clipserve's)."""
    return [dict(getattr(doc, 'tags', None) or {}) for doc in docs if str(doc.id or '').startswith(REPORT_ID)]
