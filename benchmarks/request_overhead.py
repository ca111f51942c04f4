"""Where a small served request's time goes: the model, the replica around it, the gateway, the client.

    .venv/bin/python -m benchmarks.request_overhead [--model ViT-B-32::random] [--backend torch] [--export DIR]
                                                    [--requests 200]

`clipserve serve` (served_rates.Served) on the model; one client sends `--requests` requests one after the
other (each sent when the last is answered), of one short caption: over gRPC (Jina's client, /encode, what
clip-client sends), over HTTP (/v1/embeddings), and over gRPC with no document (/encode of an empty
DocumentArray: the gateway, the wire and the replica's request handling without the model). The same caption
embedded in process (`Model`, the same backend and precision) is the model's share. For each route: the median
and 90th percentile latency, and the CPU each process spent per request (from /proc over the whole run: the
client, the gateway, the replica, and the `clipserve serve` process that started them), which is what limits
a loaded 2-core machine. Prints a table, writes benchmarks/results/request_overhead.json and a plot.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks import plots
from benchmarks.common import machine, markdown_table, save
from benchmarks.served_rates import Served, request_sender

CAPTION = 'a photo of a small brown dog running on the beach'
TICKS = os.sysconf('SC_CLK_TCK')


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of `pid` so far (its threads included)."""
    fields = Path(f'/proc/{pid}/stat').read_text().rpartition(')')[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def group_pids(pgid: int) -> list[int]:
    """The processes of the process group `pgid` (a Served Flow runs in one of its own)."""
    found = []
    for entry in Path('/proc').iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / 'stat').read_text().rpartition(')')[2].split()[2]) == pgid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
    return found


def listening_inode(port: int) -> str:
    """The socket inode listening on TCP `port` (IPv4 or IPv6)."""
    for table in ('/proc/net/tcp', '/proc/net/tcp6'):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rpartition(':')[2], 16) == port and fields[3] == '0A':
                return fields[9]
    raise LookupError(f'nothing listens on port {port}')


def owns_socket(pid: int, inode: str) -> bool:
    try:
        return any(os.readlink(fd) == f'socket:[{inode}]' for fd in Path(f'/proc/{pid}/fd').iterdir())
    except OSError:
        return False


def roles(served: Served) -> dict[str, list[int]]:
    """The Flow's processes by role: the gateway owns the public gRPC port, `serve` is the process that started
    the Flow, the replica is every other one (the executor's runtime)."""
    gateway_socket = listening_inode(served.grpc_port)
    found = {'gateway': [], 'serve': [], 'replica': []}
    for pid in group_pids(served.proc.pid):
        role = 'serve' if pid == served.proc.pid else 'gateway' if owns_socket(pid, gateway_socket) else 'replica'
        found[role].append(pid)
    return found


def cpu_by_role(pids: dict[str, list[int]]) -> dict[str, float]:
    seconds = {role: sum(cpu_seconds(pid) for pid in group) for role, group in pids.items()}
    times = os.times()
    return {**seconds, 'client': times.user + times.system}


ROUTES = {  # route -> (served_rates protocol, the texts of one request)
    'gRPC, no document': ('grpc', []),
    'gRPC /encode': ('grpc', [CAPTION]),
    'HTTP /v1': ('v1', [CAPTION]),
}


async def measure_route(served: Served, route: str, requests: int, pids: dict) -> dict:
    send, close = await request_sender(served, *ROUTES[route])
    try:
        for _ in range(5):  # warm-up: connections, first-call caches
            await send()
        latencies, before = [], cpu_by_role(pids)
        for _ in range(requests):
            started = time.perf_counter()
            await send()
            latencies.append(time.perf_counter() - started)
        after = cpu_by_role(pids)
    finally:
        await close()
    return summary(latencies, {role: (after[role] - before[role]) / requests for role in after})


def summary(latencies: list[float], cpu: dict | None = None) -> dict:
    ordered = sorted(latencies)
    return {
        'median_ms': statistics.median(ordered) * 1e3,
        'p90_ms': ordered[int(0.9 * (len(ordered) - 1))] * 1e3,
        'cpu_ms_per_request': {role: seconds * 1e3 for role, seconds in (cpu or {}).items()},
    }


def in_process(model, requests: int) -> dict:
    for _ in range(5):
        model.embed_texts([CAPTION])
    latencies, cpu_before = [], time.process_time()
    for _ in range(requests):
        started = time.perf_counter()
        model.embed_texts([CAPTION])
        latencies.append(time.perf_counter() - started)
    return summary(latencies, {'this process': (time.process_time() - cpu_before) / requests})


def table(results: dict) -> str:
    roles_ = ['client', 'gateway', 'replica', 'serve']
    rows = []
    for name, row in results['routes'].items():
        cpu = row['cpu_ms_per_request']
        rows.append(
            [name, f'{row["median_ms"]:.2f}', f'{row["p90_ms"]:.2f}']
            + [f'{cpu[r]:.2f}' if r in cpu else '-' for r in roles_]
            + [f'{sum(cpu.values()):.2f}']
        )
    headers = ['1 caption a request', 'median ms', 'p90 ms', *[f'CPU ms: {r}' for r in roles_], 'CPU ms: all']
    return markdown_table(headers, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--model', default='ViT-B-32::random')
    parser.add_argument('--backend', default='torch', choices=('torch', 'onnx'))
    parser.add_argument('--export', help='onnx: an export of --model; default: made now')
    parser.add_argument('--requests', type=int, default=200)
    args = parser.parse_args()

    from clipserve import Model

    with tempfile.TemporaryDirectory() as scratch:
        export = args.export
        if args.backend == 'onnx' and not export:
            from clipserve.backends.onnx.export import export_onnx

            export = f'{scratch}/export'
            export_onnx(args.model, export)
        model = Model(args.model, backend=args.backend, model_path=export)
        routes = {f'in process ({args.backend}, {model.precision})': in_process(model, args.requests)}
        model.close()
        with Served(args.model, args.backend, export) as served:
            pids = roles(served)
            for route in ROUTES:
                routes[f'served: {route}'] = asyncio.run(measure_route(served, route, args.requests, pids))

    results = {
        'model': args.model,
        'backend': args.backend,
        'machine': machine(),
        'requests': args.requests,
        'routes': routes,
    }
    print(table(results))
    path = save('request_overhead', results)
    plots.request_overhead(results, path)
    print(f'wrote {path}')


if __name__ == '__main__':
    main()
