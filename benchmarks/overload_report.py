"""The overload benchmark's report: the issue's goals checked, tables printed, the plot drawn."""

from __future__ import annotations

import math

from benchmarks.common import markdown_table

MEMORY_GROWTH = 0.20  # at most, after warm-up
GOODPUT = 0.90  # at least, of the sustainable rate (images/s)
SMALL_P99_BATCHES = 3.0  # a small request's p99: under this many times one batch
CPU = ('gateway', 'executor', 'client (this process)')


def _ms(seconds: float) -> str:
    return '-' if seconds is None or math.isnan(seconds) else f'{1000 * seconds:,.0f}'


def _growth(memory: dict) -> str:
    peak, end = memory.get('peak_growth', math.nan), memory.get('end_growth', math.nan)
    return f'{100 * peak:+.1f} % at peak, {100 * end:+.1f} % at the end'


def _goal(name: str, measured: str, met: bool) -> dict:
    return {'goal': name, 'measured': measured, 'met': bool(met)}


def goals(results: dict) -> list[dict]:
    """The issue's "Done when" for this benchmark, each with what was measured and whether it was met."""
    runs, out = results['runs'], []
    top = max(runs, key=lambda r: r['large_rate'], default=None)
    if top is not None:
        memory, late = top['memory'].get('total', {}), top['memory_second_half'].get('total', {})
        sustainable, goodput = 8 * top['sustainable_requests_per_s'], top['goodput_images_per_s']
        name, bound = top['name'], f'< +{100 * MEMORY_GROWTH:.0f} %'
        out += [
            _goal(
                f'{name}: memory over the warm-up (the closed loop) {bound}, whole window',
                _growth(memory),
                memory.get('peak_growth', math.inf) < MEMORY_GROWTH,
            ),
            _goal(
                f"{name}: memory in the window's second half {bound}",
                _growth(late),
                late.get('peak_growth', math.inf) < MEMORY_GROWTH,
            ),
            _goal(
                f'{name}: goodput >= {100 * GOODPUT:.0f} % of sustainable ({sustainable:.1f} images/s, bracketed)',
                f'{goodput:.1f} images/s = {100 * goodput / sustainable:.0f} %',
                goodput >= GOODPUT * sustainable,
            ),
            _goal(
                f'{name}: the same per second of executor CPU time (robust to other work on the machine): '
                f">= {100 * GOODPUT:.0f} % of the closed loop's",
                f'{top["images_per_cpu_s"]:.2f} vs {top["closed_images_per_cpu_s"]:.2f} images per CPU-second = '
                f'{100 * top["images_per_cpu_s"] / top["closed_images_per_cpu_s"]:.0f} %',
                top['images_per_cpu_s'] >= GOODPUT * top['closed_images_per_cpu_s'],
            ),
            *_mixed_goals(top),
            _goal(
                f'{name}: every refusal a clear retryable error',
                f'{top["refused"]} clear, {top["refused_unclear"]} unclear',
                top['refused_unclear'] == 0,
            ),
            _goal(f'{name}: no errors of another kind', f'{top["error"]}', top['error'] == 0),
            _goal(
                f'{name}: nothing accepted is lost',
                f'{top["lost"]} unanswered, {top["in_flight_after"]} still in flight on the executor',
                top['lost'] == 0 and top['in_flight_after'] == 0,
            ),
        ]
    for run in runs:
        batch = run['one_batch_s']
        worst = max(run['kinds'][k]['p99_s'] for k in ('text', 'image'))
        out.append(
            _goal(
                f'{run["name"]}: small p99 < {SMALL_P99_BATCHES:g}x one batch ({_ms(SMALL_P99_BATCHES * batch)} ms)',
                f'text {_ms(run["kinds"]["text"]["p99_s"])} ms, image {_ms(run["kinds"]["image"]["p99_s"])} ms '
                f'= {worst / batch:.1f}x',
                worst < SMALL_P99_BATCHES * batch,  # False for nan (none answered)
            )
        )
    soak = results.get('soak')
    if soak:
        grown = soak['memory_after_warmup'].get('total', {})
        out.append(
            _goal(
                f'{soak["name"]} ({soak["window_s"] / 60:g} min): memory after warm-up (the first '
                f'{soak["warm_s"]:.0f} s) < +{100 * MEMORY_GROWTH:.0f} %',
                _growth(grown),
                grown.get('peak_growth', math.inf) < MEMORY_GROWTH,
            )
        )
    return out


def _large_share(run: dict) -> float:
    """The run's large requests answered per second, of what the closed loop sustains besides the same small
    requests (nan without that measure)."""
    sustainable = run.get('sustainable_with_small_requests_per_s')
    return run['kinds']['large']['ok'] / run['span_s'] / sustainable if sustainable else math.nan


def _mixed_goals(top: dict) -> list[dict]:
    """Goodput like for like: the large requests answered under overload against what the closed loop
    sustains while the same small requests arrive (they are all answered at any load, and cost their share)."""
    if not top.get('sustainable_with_small_requests_per_s'):
        return []
    name, share = top['name'], _large_share(top)
    per_cpu = top['large_images_per_cpu_s'] / top['mixed_closed_images_per_cpu_s']
    return [
        _goal(
            f"{name}: large requests' goodput >= {100 * GOODPUT:.0f} % of what the closed loop sustains besides "
            f'the same small requests ({top["sustainable_with_small_requests_per_s"]:.2f} requests/s, bracketed)',
            f'{top["kinds"]["large"]["ok"] / top["span_s"]:.2f} requests/s = {100 * share:.0f} %',
            share >= GOODPUT,
        ),
        _goal(
            f'{name}: the same per second of executor CPU time',
            f'{top["large_images_per_cpu_s"]:.2f} vs {top["mixed_closed_images_per_cpu_s"]:.2f} large images per '
            f'CPU-second = {100 * per_cpu:.0f} %',
            per_cpu >= GOODPUT,
        ),
    ]


def _runs(results: dict) -> list[dict]:
    return results['runs'] + ([results['soak']] if results.get('soak') else [])


def print_report(results: dict) -> None:
    info = results['machine']
    loads = [s[2] for s in results['rss_samples']]
    closed = ', '.join(f'{c["requests_per_s"]:.2f}' for c in results['closed'])
    batches = ', '.join(_ms(b['median_s']) for b in results['one_batch'])
    replica = results['replica']
    print(
        f'\n{results["model"]} on flows/onnx.yml ({replica["backend"]} {replica["dtype"]}, {replica["threads"]:g} '
        f'threads, limits {replica["limits"]}); {info["cpu"]}, {info["cores"]} cores, {info["when"]}; load average '
        f'{info["load_avg"]:.2f} at start, {min(loads):.2f}-{max(loads):.2f} during, {results["load_avg_end"]:.2f} at end'
    )
    code = results.get('code', {})
    changed = f' + {len(code["changed"])} changed files under executors/, flows/' if code.get('changed') else ''
    print(f'code: {code.get("commit", "?")}{changed}')
    print(
        f'sustainable (closed loop of large requests, {results["args"]["closed_clients"]} clients, before the first '
        f'run and after each): {closed} requests/s; one batch (8 images, model only, at the same points): '
        f'{batches} ms; {results["args"]["arrivals"]} arrivals, {100 * results["args"]["small_fraction"]:.0f} % '
        'small; each run compared with the mean of the measures just before and after it\n'
    )
    rows = []
    for r in _runs(results):
        limits = ', '.join(r['refusal_limits']) or '-'
        sent = r['sent_per_s']
        rows.append(
            [
                r['name'],
                f'{r["large_rate"]:.2f} ({r["large_rate"] / r["sustainable_requests_per_s"]:.1f}x)',
                f'{sent["large"]:.2f} / {sent["text"] + sent["image"]:.2f}',
                f'{r["window_s"]:g} + {r["span_s"] - r["window_s"]:.0f}',
                f'{r["goodput_requests_per_s"]:.2f} ({r["goodput_requests_per_s_in_window"]:.2f})',
                f'{r["goodput_images_per_s"]:.1f} ({r["goodput_images_per_s_in_window"]:.1f})',
                f'{8 * r["sustainable_requests_per_s"]:.1f}',
                f'{100 * r["goodput_images_per_s"] / (8 * r["sustainable_requests_per_s"]):.0f} %',
                '-' if math.isnan(_large_share(r)) else f'{100 * _large_share(r):.0f} %',
                f'{r["model_images"] / r["span_s"]:.1f}',
                f'{r["images_per_cpu_s"]:.2f} ({100 * r["images_per_cpu_s"] / r["closed_images_per_cpu_s"]:.0f} %)',
                f'{r["refused"]} ({limits})',
                r['refused_unclear'],
                r['error'],
                f'{r["lost"]} / {r["in_flight_after"]}',
                f'{r["max_send_lag_s"]:.2f}',
                ' / '.join(f'{r["cpu_seconds"].get(n, math.nan) / r["span_s"]:.2f}' for n in CPU),
            ]
        )
    print(
        markdown_table(
            [
                'run',
                'offered large req/s (x sustainable)',
                'sent large / small per s',
                'window + drain s',
                'goodput req/s (in window)',
                'goodput images/s (in window)',
                'sustainable images/s',
                'goodput of sustainable',
                'large goodput of sustainable besides the same small requests',
                'model images/s',
                'images per executor CPU-s (of closed loop)',
                'refused, clear (limit)',
                'refused, unclear',
                'other errors',
                'lost / in flight after',
                'client lag s',
                'CPU cores: gateway / executor / client',
            ],
            rows,
        )
    )
    print()
    rows = []
    for r in _runs(results):
        k = r['kinds']
        cells = [r['name']]
        for kind in ('large', 'text', 'image'):
            cells.append(f'{_ms(k[kind]["p50_s"])} / {_ms(k[kind]["p99_s"])} ({k[kind]["ok"]} of {k[kind]["sent"]})')
        small = max(k['text']['p99_s'], k['image']['p99_s'])
        cells += [_ms(r['one_batch_s']), f'{small / r["one_batch_s"]:.1f}x', _ms(r['refused_latency_p99_s'])]
        rows.append(cells)
    print(
        markdown_table(
            [
                'run',
                'large p50 / p99 ms (ok of sent)',
                'text p50 / p99 ms',
                'image p50 / p99 ms',
                'one batch ms',
                'small p99 / one batch',
                'refusal p99 ms',
            ],
            rows,
        )
    )
    print()
    rows = []
    for r in _runs(results):
        memory = r.get('memory_after_warmup') or r['memory']
        cells = [r['name'] + (' (after its warm-up)' if 'memory_after_warmup' in r else '')]
        for name in ('gateway', 'executor', 'total'):
            m = memory.get(name)
            cells.append(
                '-'
                if m is None
                else f'{m["baseline_mb"]:,.0f} -> {m["peak_mb"]:,.0f} ({100 * m["peak_growth"]:+.1f} %)'
            )
        total, late = memory.get('total'), r['memory_second_half'].get('total')
        cells.append('-' if total is None else f'{100 * total["end_growth"]:+.1f} %')
        cells.append('-' if late is None else f'{100 * late["peak_growth"]:+.1f} %')
        rows.append(cells)
    print(
        markdown_table(
            [
                'run',
                'gateway RSS MiB base -> peak',
                'executor RSS MiB base -> peak',
                'total',
                'total at the end',
                'total, 2nd half of the window',
            ],
            rows,
        )
    )
    print()
    print(
        markdown_table(
            ['goal', 'measured', 'met'],
            [[g['goal'], g['measured'], 'yes' if g['met'] else '**no**'] for g in results['goals']],
        )
    )
    for r in _runs(results):
        for sample in r['error_samples']:
            print(f'  {r["name"]}: {sample}')
