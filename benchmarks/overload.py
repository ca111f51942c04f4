"""Overload: the shipped onnx Flow offered 1x, 2x and 4x its sustainable rate, large and small requests mixed.

    .venv/bin/python -m benchmarks.overload [--model ViT-B-32::random] [--window 30] [--loads 1 2 4]
        [--small-fraction 0.2] [--arrivals poisson|fixed] [--soak MINUTES] [--client lean|jina]
        [--no-mixed-baseline] [--set max_documents=128 ...]

flows/onnx.yml (ReadyGateway, gRPC) serves an ONNX export of `--model` on a free port of 127.0.0.1. A closed
loop (`--closed-clients` clients, each sending its next request when its last is answered) measures the
sustainable rate of large requests (8 JPEGs of 640x480 each). Then, per load, an open loop sends requests
on a schedule (Poisson by default), never waiting for answers: large requests at that multiple of the
sustainable rate measured just before, plus small ones (one short text, or one JPEG) making
`--small-fraction` of all requests, for `--window` seconds; then it waits up to `--drain` seconds for every
answer. The closed loop and one batch (one forward pass of 8 images, model only, timed in this process
while the Flow is idle) are measured again after each run, and each run is compared with the mean of the
measures around it: the machine's speed drifts with other work on it. Small requests are never refused
(the replica keeps places for them) and cost the Flow their share at any load, so, like for like, the closed
loop is also measured just before and after each run while the same small requests arrive as in the run
(`--no-mixed-baseline`: not), and the run's large requests are compared with what it sustained besides them.

Per run it prints the offered rate; goodput (requests answered correctly, and their images, per second
from the window's start to the last answer; in brackets, counted within the window only; and, robust to
other work on the machine, images per second of the executor's CPU time against the closed loop's); p50/p99
latency per kind; refusals (clear: the client can read which limit and when to retry, e.g.
OverloadedError with {'limit', 'retry_after'}, or a gateway's RESOURCE_EXHAUSTED with retry-after);
errors of any other kind; requests never answered ("lost") and requests still held by the executor
after the drain; the CPU each process used; the resident memory of each of the Flow's processes (VmRSS
every 0.5 s) as growth over the end of the first closed loop (the warm-up) and within the window's
second half. `--soak MINUTES` adds an open loop at `--soak-load` x for that long: memory after its
warm-up (a minute in, or its first refusal, whichever is later). `--set` gives executor settings
(as CLIPSERVE_* variables). The load generator runs in this process (asyncio), on the same cores as the
Flow (the load average is recorded): by default a lean one (one gRPC connection, each kind's request
serialized once), so that the Flow has the cores as it would with its clients on other machines;
`--client jina` sends with Jina's own client as clip-client does (a connection per request, requests built
and answers parsed as DocumentArrays), which costs the shared cores more (benchmarks/overload_clients.py).
Writes benchmarks/results/overload.json and overload.png.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import plots
from benchmarks.common import machine, save
from benchmarks.overload_clients import closed_loop, offer
from benchmarks.overload_helpers import (
    RssSampler,
    arrivals,
    cpu_seconds,
    memory_growth,
    summarize,
)
from benchmarks.overload_report import goals, print_report

ROOT = Path(__file__).resolve().parents[1]


def flow_from_shipped_yaml(port: int, model: str, onnx_dir: str, folder: str):
    """flows/onnx.yml as shipped, on `port`, serving the export in `onnx_dir` (names resolved at load)."""
    import yaml
    from jina import Flow

    config = yaml.safe_load((ROOT / 'flows' / 'onnx.yml').read_text())
    config['gateway']['port'] = port
    path = Path(folder) / 'onnx.yml'
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    os.environ.update(CLIPSERVE_MODEL=model, CLIPSERVE_MODEL_PATH=onnx_dir)
    return Flow.load_config(str(path))


def replica_info(port: int) -> dict:
    from docarray import Document, DocumentArray
    from jina import Client

    responses = Client(host='127.0.0.1', port=port).post(
        '/clipserve/info', DocumentArray([Document()]), return_responses=True
    )
    return next(iter(responses[0].parameters['__results__'].values()))


def flow_processes(port: int, executor_pid: int) -> dict[str, int]:
    """Every process of the Flow (this script's descendants), named: the executor (its /clipserve/info pid),
    the gateway (the one listening on the Flow's port), others by pid and what they run."""
    from devkit.procfs import descendants, listening

    pids = descendants(os.getpid())
    gateway = {pid for _, p, pid in listening(pids) if p == port}

    def name(pid: int) -> str:
        if pid == executor_pid:
            return 'executor'
        if pid in gateway:
            return 'gateway'
        try:
            words = Path(f'/proc/{pid}/cmdline').read_bytes().replace(b'\0', b' ').decode(errors='replace')
        except OSError:
            words = ''
        return f'pid {pid}' + (' (resource tracker)' if 'resource_tracker' in words else '')

    return {name(pid): pid for pid in pids}


def code_state() -> dict:
    """The commit measured, and the files under executors/ that differ from it (work in progress included)."""
    import subprocess

    def git(*words: str) -> str:
        try:
            return subprocess.run(['git', *words], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ''

    changed = git('status', '--porcelain', '--', 'executors', 'flows')
    return {'commit': git('rev-parse', '--short', 'HEAD'), 'changed': [line[3:] for line in changed.splitlines()]}


class OneBatch:
    """One forward pass of 8 images, model only (preprocessed before the clock), with the executor's threads:
    the model is loaded in this process once, and timed whenever the Flow is idle."""

    def __init__(self, model: str, onnx_dir: str, jpeg: bytes):
        from clipserve.backends import BackendOptions, create_backend
        from clipserve.models.preprocess import preprocess_bytes

        threads = len(os.sched_getaffinity(0))
        options = BackendOptions(device='cpu', dtype='fp32', num_threads=threads)
        self.backend = create_backend('onnx', model, options, model_path=onnx_dir)
        self.pixels = np.stack([preprocess_bytes(jpeg, self.backend.preprocess) for _ in range(8)])
        self.backend.encode_images(self.pixels)
        self.timings: list[dict] = []

    def measure(self, repeats: int = 6) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            self.backend.encode_images(self.pixels)
            times.append(time.perf_counter() - t0)
        self.timings.append({'median_s': float(np.median(times)), 'min_s': min(times), 'max_s': max(times)})
        return self.timings[-1]['median_s']


def run_load(port, sampler, name, large_rate, seconds, args, jpeg, baseline) -> dict:
    """One open loop, with the executor's counters and the Flow's memory around it."""
    before = replica_info(port)
    processes = {**sampler.pids, 'client (this process)': os.getpid()}
    cpu = {name: cpu_seconds(pid) for name, pid in processes.items()}
    schedule = arrivals(large_rate, seconds, args.small_fraction, args.arrivals == 'poisson', seed=args.seed)
    at = sampler.now()
    outcomes = asyncio.run(offer(port, schedule, args.drain, jpeg, name, args.client))
    ended = sampler.now()
    after = replica_info(port)
    cpu = {name: cpu_seconds(pid) - cpu[name] for name, pid in processes.items() if cpu[name] is not None}
    summary = summarize(outcomes, seconds)
    summary.update(
        name=name,
        large_rate=large_rate,
        window_s=seconds,
        started_at=at,
        ended_at=ended,
        executor_refused=int(after['refused'] - before['refused']),
        model_images=int(after['images_encoded'] - before['images_encoded']),
        model_texts=int(after['texts_encoded'] - before['texts_encoded']),
        model_calls=int(after['model_calls'] - before['model_calls']),
        in_flight_after=int(after['requests_in_flight']),
        cpu_seconds=cpu,
        load_avg=[round(s[2], 2) for s in sampler.between(at, ended)][:: max(1, int(seconds))],
        outcomes=[o.as_dict() for o in outcomes],
    )
    summary['memory'] = memory_growth(sampler, baseline, (at, ended))
    middle = at + seconds / 2  # the second half of the window against the two seconds before it
    summary['memory_second_half'] = memory_growth(sampler, (middle - 2, middle), (middle, at + seconds))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--model', default='ViT-B-32::random')
    parser.add_argument('--window', type=float, default=30.0, help='seconds each open loop sends for')
    parser.add_argument('--loads', type=float, nargs='*', default=[1, 2, 4], help='multiples of the sustainable rate')
    parser.add_argument('--small-fraction', type=float, default=0.2, help='share of small requests (text / image)')
    parser.add_argument('--arrivals', choices=['poisson', 'fixed'], default='poisson')
    parser.add_argument(
        '--client',
        choices=['lean', 'jina'],
        default='lean',
        help="load generator: one connection, requests serialized once (lean), or Jina's client as clip-client",
    )
    parser.add_argument(
        '--mixed-baseline',
        action=argparse.BooleanOptionalAction,
        default=True,
        help='also measure, around each run, the closed loop besides the same small requests',
    )
    parser.add_argument('--closed-clients', type=int, default=8)
    parser.add_argument('--closed-seconds', type=float, default=20.0)
    parser.add_argument('--rate', type=float, help='the sustainable large requests/s (skips the first closed loop)')
    parser.add_argument('--drain', type=float, default=330.0, help='seconds to wait for answers after a window')
    parser.add_argument('--soak', type=float, default=0.0, help='minutes of an open loop at --soak-load (0: off)')
    parser.add_argument('--soak-load', type=float, default=2.0)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--set', nargs='*', default=[], metavar='SETTING=VALUE', help='executor settings (env)')
    args = parser.parse_args()
    os.environ.setdefault('JINA_LOG_LEVEL', 'ERROR')
    os.environ.setdefault('JINA_MP_START_METHOD', 'spawn')
    for item in args.set:
        key, _, value = item.partition('=')
        os.environ[f'CLIPSERVE_{key.upper()}'] = value
    import jina  # noqa: F401 - first, so that it sets the start method (spawn) before anything else can

    from benchmarks.serving import free_port, jpeg_640x480
    from clipserve.backends.onnx.export import export_onnx

    info = machine()
    jpeg = jpeg_640x480()
    results = {'model': args.model, 'machine': info, 'args': vars(args), 'code': code_state(), 'runs': []}

    def measure_closed(small_rate: float = 0.0) -> dict:
        """The closed loop, with the images it had answered per second of the executor's CPU time."""
        before = replica_info(port)
        executor, seconds = sampler.pids['executor'], args.closed_seconds
        run = asyncio.run(closed_loop(port, args.closed_clients, seconds, jpeg, executor, args.client, small_rate))
        after = replica_info(port)
        run['model_calls'] = int(after['model_calls'] - before['model_calls'])  # warm-up requests included
        run['model_images'] = int(after['images_encoded'] - before['images_encoded'])
        return run

    def bracket(run: dict) -> None:
        """The machine's speed just after a run, with the one just before: sustainable rate and one batch."""
        closed.append(measure_closed())
        batches.append(one_batch.measure())
        run['sustainable_requests_per_s'] = (closed[-2]['requests_per_s'] + closed[-1]['requests_per_s']) / 2
        run['closed_images_per_cpu_s'] = (closed[-2]['images_per_cpu_s'] + closed[-1]['images_per_cpu_s']) / 2
        run['images_per_cpu_s'] = run['model_images'] / max(1e-9, run['cpu_seconds'].get('executor', math.nan))
        run['one_batch_s'] = (batches[-2] + batches[-1]) / 2
        print(
            f'{run["name"]}: {run["ok"]} ok, {run["refused"]} refused, {run["error"]} errors, {run["lost"]} lost; '
            f'sustainable {closed[-1]["requests_per_s"]:.2f} requests/s, one batch {1000 * batches[-1]:.0f} ms; '
            f'{run["model_calls"]} forward passes ({run["model_images"]} images, {run["model_texts"]} texts), the '
            f'closed loop {closed[-1]["model_images"] / max(1, closed[-1]["model_calls"]):.1f} images per pass'
        )

    def with_small(large_rate: float) -> dict | None:
        """The closed loop besides the small requests an open loop at `large_rate` sends (--mixed-baseline)."""
        if not args.mixed_baseline or args.small_fraction <= 0:
            return None
        return measure_closed(large_rate * args.small_fraction / (1 - args.small_fraction))

    def against_mixed(run: dict, before: dict | None, after: dict | None) -> None:
        """The run's large requests against what the closed loop sustains besides the same small requests."""
        if before is None or after is None:
            return
        run['mixed_closed'] = [before, after]
        run['sustainable_with_small_requests_per_s'] = (before['requests_per_s'] + after['requests_per_s']) / 2
        run['mixed_closed_images_per_cpu_s'] = (before['images_per_cpu_s'] + after['images_per_cpu_s']) / 2
        large = 8 * run['kinds']['large']['ok']
        run['large_images_per_cpu_s'] = large / max(1e-9, run['cpu_seconds'].get('executor', math.nan))
        print(
            f'{run["name"]}: besides the same small requests the closed loop sustains '
            f'{before["requests_per_s"]:.2f}, {after["requests_per_s"]:.2f} large requests/s; the run answered '
            f'{large / run["span_s"] / 8:.2f}/s'
        )

    with tempfile.TemporaryDirectory(prefix='clipserve-overload-') as workdir:
        onnx_dir = str(Path(workdir) / 'onnx')
        export_onnx(args.model, onnx_dir)
        one_batch = OneBatch(args.model, onnx_dir, jpeg)
        port = free_port()
        with flow_from_shipped_yaml(port, args.model, onnx_dir, workdir):
            replica = replica_info(port)
            results['replica'] = {k: replica[k] for k in ('backend', 'dtype', 'threads', 'pid')}
            results['replica']['limits'] = {k: int(v) for k, v in replica['limits'].items()}
            with RssSampler(flow_processes(port, int(replica['pid']))) as sampler:
                results['processes'] = sampler.pids
                at = sampler.now()
                closed = [measure_closed()]
                baseline = (max(at, sampler.now() - 5), sampler.now())  # after warm-up: the closed loop's end
                batches = [one_batch.measure()]

                def rate() -> float:  # the closed loop just before: the machine's speed drifts with other work
                    return args.rate or closed[-1]['requests_per_s']

                print(
                    f'sustainable {rate():.2f} large requests/s, one batch {1000 * batches[0]:.0f} ms; loads {args.loads}'
                )
                for load in args.loads:
                    large_rate = load * rate()
                    mixed_before = with_small(large_rate)
                    run = run_load(port, sampler, f'{load:g}x', large_rate, args.window, args, jpeg, baseline)
                    results['runs'].append(run)
                    bracket(run)
                    against_mixed(run, mixed_before, with_small(large_rate))
                if args.soak > 0:
                    name, seconds, large_rate = f'soak {args.soak_load:g}x', 60 * args.soak, args.soak_load * rate()
                    mixed_before = with_small(large_rate)
                    soak = run_load(port, sampler, name, large_rate, seconds, args, jpeg, baseline)
                    # warmed up: a minute (a quarter of a short soak) in, and the replica full (its first refusal)
                    warm = min(max(min(60.0, seconds / 4), soak['first_refusal_s'] or 0.0), seconds / 2)
                    warm += soak['started_at']
                    soak['warm_s'] = warm - soak['started_at']
                    soak['memory_after_warmup'] = memory_growth(sampler, (warm - 5, warm), (warm, soak['ended_at']))
                    results['soak'] = soak
                    bracket(soak)
                    against_mixed(soak, mixed_before, with_small(large_rate))
            results['final_replica'] = replica_info(port)
        one_batch.backend.close()
    results.update(
        closed=closed,
        sustainable_requests_per_s=float(np.mean([c['requests_per_s'] for c in closed])),
        one_batch=one_batch.timings,
        one_batch_s=float(np.mean(batches)),
        rss_samples=[(round(t, 2), rss, round(load, 2)) for t, rss, load in sampler.samples],
        load_avg_end=os.getloadavg()[0],
    )
    results['goals'] = goals(results)
    print_report(results)
    path = save('overload', results)
    plots.overload(results, path)
    print(f'\nwrote {path}')


if __name__ == '__main__':
    main()
