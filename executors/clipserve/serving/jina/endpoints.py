"""clipserve's own endpoints and the readiness report's wire form, the same in both DocArray flavours.

No DocArray here: the v1 documents (replica/documents.py) and the v2 ones (replica/documents_v2.py) both write the report
as a document whose id starts with REPORT_ID and whose tags hold it; the gateway's probe (gateway/readiness.py)
reads it back from whichever documents its Jina parses the answer into.
"""

from __future__ import annotations

from clipserve.engine.output_kind import MAXSIM_SCORE  # noqa: F401  (the score a late-interaction /rank writes)

INFO_ENDPOINT = '/clipserve/info'
READY_ENDPOINT = '/clipserve/ready'
# a text document's token count, written into its tags when the request asks (options.TOKEN_COUNTS_PARAMETER)
TOKEN_COUNT_TAG = 'clipserve_tokens'
ADMISSION_TAG = 'admission'  # a report's bound on requests, which the gateway mirrors (gateway/replica_room.py)
REPORT_ID = 'clipserve-ready-shard-'  # one document per shard: a head polling ALL merges them by id


def ready_report_fields(shard_id: int, shards: int, draining: bool, admission: dict | None = None) -> tuple[str, dict]:
    """(document id, tags) of one copy's answer to READY_ENDPOINT; `admission`: the bound the gateway mirrors
    (gateway/replica_room.py: max_requests, small_documents, retry_after, executor)."""
    tags = {'draining': draining, 'shard_id': shard_id, 'shards': shards}
    if admission is not None:
        tags[ADMISSION_TAG] = admission
    return f'{REPORT_ID}{shard_id}', tags


def read_reports(docs) -> list[dict]:
    """The reports in an answer to READY_ENDPOINT (none from an executor that is not clipserve's)."""
    return [dict(getattr(doc, 'tags', None) or {}) for doc in docs if str(doc.id or '').startswith(REPORT_ID)]
