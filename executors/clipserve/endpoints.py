"""The endpoints clipserve's executors add to clip-as-service's, and the readiness report's wire form.

The executor writes a readiness report and the gateway reads it (through a head that merges the
shards' documents), so both sides take its shape from here.
"""

from __future__ import annotations

from docarray import Document, DocumentArray

INFO_ENDPOINT = '/clipserve/info'
READY_ENDPOINT = '/clipserve/ready'
# a text document's token count, written into its tags when the request asks (options.TOKEN_COUNTS_PARAMETER)
TOKEN_COUNT_TAG = 'clipserve_tokens'
_REPORT_ID = 'clipserve-ready-shard-'  # one document per shard: a head polling ALL merges them by id


def ready_report(shard_id: int, shards: int, draining: bool) -> DocumentArray:
    """This copy's answer to READY_ENDPOINT. Documents rather than returned parameters: Jina keys those
    by executor name, which the shards share, so a head would keep only one shard's."""
    return DocumentArray(
        [Document(id=f'{_REPORT_ID}{shard_id}', tags={'draining': draining, 'shard_id': shard_id, 'shards': shards})]
    )


def read_reports(docs: DocumentArray) -> list[dict]:
    """The reports in an answer to READY_ENDPOINT (none from an executor that is not clipserve's)."""
    return [dict(doc.tags) for doc in docs if doc.id.startswith(_REPORT_ID)]
