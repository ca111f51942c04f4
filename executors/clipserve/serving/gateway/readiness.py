"""Is the whole Flow ready? The gateway's answer: every replica and every shard of every executor answers.

Jina's own checks (`jina ping`, the HTTP `GET /status`, a first successful request) say yes as soon as
one copy of each executor answers: a sharded or replicated Flow looks ready while other copies still
load. This module asks every copy. The gateway knows each replica's address; a sharded executor sits
behind its head, which forwards `/clipserve/ready` to every shard when the Flow polls that endpoint
with ALL (as `flows/shards.yml` does). A copy is ready when it answers: Jina's worker listens only
after the executor's constructor, which loads the model and runs the warm-up, has returned. A copy that
is draining (SIGTERM) refuses new calls or says it is draining.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

import grpc

from clipserve.serving.jina.compat import post_to_executor
from clipserve.serving.jina.endpoints import READY_ENDPOINT, read_reports

READY_PATH = '/readyz'  # HTTP GET: 200 ready, 503 not ready
LIVE_PATH = '/livez'  # HTTP GET: 200 while the gateway answers
HEALTH_PATH = '/health'  # HTTP GET: the same as READY_PATH (TEI's and Infinity's name)
READINESS_SERVICE = 'readiness'  # gRPC health service name; '' (Jina's) stays liveness

logger = logging.getLogger(__name__)


def grpc_addresses(deployments_addresses) -> dict[str, list[str]]:
    """The gateway's `deployments_addresses` (JSON; a list or a {protocol: list} per executor) as gRPC targets."""
    table = json.loads(deployments_addresses) if isinstance(deployments_addresses, str) else deployments_addresses
    found = {}
    for name, addresses in (table or {}).items():
        if isinstance(addresses, dict):
            addresses = addresses.get('grpc', [])
        found[name] = [str(a) for a in addresses]
    return found


@dataclass
class Verdict:
    ready: bool
    reasons: list[str] = field(default_factory=list)  # for the gateway's log, never for the caller


def judge_reports(deployment: str, address: str, reports: list[dict]) -> list[str]:
    """What keeps one answering address from being ready, from the readiness reports it returned.

    No report at all: an executor without this endpoint (not clipserve's), up since it answered.
    """
    problems = [
        f'{deployment} at {address}: shard {r.get("shard_id", 0)} is draining' for r in reports if r.get('draining')
    ]
    if reports:
        shards = max(int(r.get('shards', 1) or 1) for r in reports)
        seen = {int(r.get('shard_id', 0) or 0) for r in reports}
        missing = sorted(set(range(shards)) - seen)
        if missing:
            problems.append(
                f'{deployment} at {address}: no answer from shard(s) {missing} of {shards} (still '
                f'loading, or the Flow lacks `polling: {{{READY_ENDPOINT}: ALL}}` on this executor)'
            )
    return problems


async def probe_address(address: str, timeout: float) -> list[dict]:
    """Send `/clipserve/ready` to one executor or head; the readiness reports it answers with.

    Raises on no answer or an error answer (a head whose shard is not up answers with an error).
    """
    return read_reports(await post_to_executor(address, READY_ENDPOINT, timeout))


class FlowReadiness:
    """Probes every executor address of the Flow, once per `interval`, and keeps the verdict.

    A copy that was ready and is now only slow to answer (a probe timing out behind a burst of
    work) stays ready for up to `busy_allowance` seconds; a refused connection, an error or a
    draining report count at once.
    """

    def __init__(
        self,
        deployments: dict[str, list[str]],
        interval: float = 1.0,
        timeout: float = 5.0,
        busy_allowance: float = 30.0,
        log: logging.Logger | None = None,
        probe=None,
    ):
        self.deployments = deployments
        self.summary = ''  # where the Flow listens and whether it asks a token: the ready line's end (gateways.py)
        self.interval = interval
        self.timeout = timeout
        self.busy_allowance = busy_allowance
        self.log = log or logger
        self.probe = probe or probe_address
        self.verdict = Verdict(False, ['not probed yet'])
        self.listeners = []  # async callables taking the new `ready` bool, called on every change
        self.report_listeners = []  # callables taking (deployments, reports), called after every probe
        self.reports: dict[str, list[dict]] = {}  # address -> its latest reports, answering addresses only
        self.closing = False
        self._last_ready: dict[str, float] = {}  # address -> when it last answered ready

    @property
    def ready(self) -> bool:
        return self.verdict.ready and not self.closing

    async def _check_one(self, deployment: str, address: str) -> list[str]:
        try:
            reports = await self.probe(address, self.timeout)
            problems = judge_reports(deployment, address, reports)
        except Exception as error:  # no answer yet, refused (draining), an error from a head
            code = error.code() if isinstance(error, grpc.aio.AioRpcError) else None
            last = self._last_ready.get(address)
            if (
                code == grpc.StatusCode.DEADLINE_EXCEEDED
                and last is not None
                and time.monotonic() - last < self.busy_allowance
            ):
                return []  # was ready, now busy: not a reason to take it out of rotation yet
            self._last_ready.pop(address, None)
            self.reports.pop(address, None)
            return [f'{deployment} at {address}: {code.name if code else str(error)[:200]}']
        if problems:
            self._last_ready.pop(address, None)
            self.reports.pop(address, None)
        else:
            self._last_ready[address] = time.monotonic()
            self.reports[address] = reports
        return problems

    async def check(self) -> Verdict:
        checks = [self._check_one(d, a) for d, addresses in self.deployments.items() for a in addresses]
        reasons = [r for problems in await asyncio.gather(*checks) for r in problems]
        for listener in self.report_listeners:
            listener(self.deployments, self.reports)
        return Verdict(not reasons, reasons)

    async def run(self) -> None:
        while not self.closing:
            try:
                await self.update(await self.check())
            except Exception as error:  # keep probing; the verdict stays what it was
                self.log.warning(f'readiness probe failed: {error!r}')
            await asyncio.sleep(self.interval)

    async def update(self, verdict: Verdict) -> None:
        if verdict.ready != self.verdict.ready or verdict.reasons != self.verdict.reasons:
            if verdict.ready:
                where = f'; {self.summary}' if self.summary else ''
                self.log.info(f'Flow ready: every copy of {len(self.deployments)} executor(s) answers{where}')
            else:
                self.log.info('Flow not ready: ' + '; '.join(verdict.reasons))
        changed = verdict.ready != self.verdict.ready
        self.verdict = verdict
        if changed:
            await self.notify()

    async def notify(self) -> None:
        for listener in self.listeners:
            await listener(self.ready)

    async def close(self) -> None:
        """The gateway is stopping: not ready from now on."""
        self.closing = True
        await self.notify()
