"""The benchmarks' plots, drawn from their result files alone.

Each benchmark script writes `benchmarks/results/NAME.json` and draws `NAME.png` with the function of the
same name here; the docs site draws the same plots at build time from the result files committed under
`benchmarks/published/` (docs/hooks/mkdocs_hooks.py), so the site's pictures are those of the runs its
tables quote, on any machine that builds it. Only matplotlib and the standard library: the docs' own
environment imports this file.

    python -m benchmarks.plots [--results benchmarks/published] [--out DIR]   # every NAME.json it can draw
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PUBLISHED = Path(__file__).parent / 'published'
SMALL_P99_BATCHES = 3.0  # the overload benchmark's goal for a small request's p99, in batches
REFUSED_STATUSES = ('refused', 'refused_unclear')  # benchmarks/overload_helpers.py's refusal outcomes


def figure(path: Path, draw, ncols: int = 1, figsize: tuple = (7, 3.5)) -> bool:
    """`draw(axes)` onto a figure saved as `path` with the suffix .png; False where matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        print('(matplotlib not installed: no plot)')
        return False
    fig, axes = plt.subplots(1, ncols, figsize=figsize)
    draw(axes)
    fig.tight_layout()
    fig.savefig(Path(path).with_suffix('.png'), dpi=100)
    plt.close(fig)
    return True


def _bars(ax, labels: list[str], series: dict[str, list[float]]) -> None:
    """Grouped bars: one group per label, one bar per series."""
    width = 0.8 / max(1, len(series))
    for k, (name, values) in enumerate(series.items()):
        ax.bar([i + (k - (len(series) - 1) / 2) * width for i in range(len(labels))], values, width, label=name)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)


def text_rates(ax, r: dict) -> None:
    """The short-text rates (model at batch 8 and at its best, the Flow with 1 and 4 clients, FastEmbed)."""
    bars = {
        'model@8': r['model_at_8'],
        f'model@{r["model_best_batch"]}': r['model_at_best'],
        'Flow(1)': r['flow_1_client'],
        'Flow(4)': r['flow_4_clients'],
    }
    if 'fastembed' in r:
        bars[f'FastEmbed@{r["fastembed_batch"]}'] = r['fastembed']
    ax.bar(range(len(bars)), list(bars.values()), color=['C0', 'C0', 'C1', 'C2', 'C3'][: len(bars)])
    ax.set_xticks(range(len(bars)), list(bars), fontsize=8)
    ax.set_ylabel('texts/s')
    title = f'onnx, short texts: Flow(4)/model@best {r["flow_4_vs_model_best"]:.2f}'
    if 'fastembed' in r:
        title += f', Flow(4)/FastEmbed {r["flow_4_vs_fastembed"]:.2f}'
    ax.set_title(title, fontsize=9)


def serving(results: dict, path: Path) -> bool:
    compared = results.get('text_rates')

    def draw(axes):
        ax = axes[0] if compared else axes
        rows = results['rows']
        series = {
            key.replace('_', ' '): [r[key] for r in rows] for key in ('model_only', 'flow_1_client', 'flow_4_clients')
        }
        _bars(ax, [f'{r["backend"]}\n{r["workload"]}' for r in rows], series)
        ax.set_ylabel('items/s')
        ax.set_yscale('log')
        ax.legend()
        ax.set_title(f'{results["model"]}: model-only vs served ({results["machine"]["cores"]} cores)')
        if compared:
            text_rates(axes[1], compared)

    return figure(path, draw, ncols=2 if compared else 1, figsize=(16, 4) if compared else (10, 4))


def precision(results: dict, path: Path) -> bool:
    measured = [r for r in results['results'] if 'refused' not in r]

    def draw(axes):
        labels = [r['config'] for r in measured]
        axes[0].bar(labels, [r['images_vs_torch_fp32'] for r in measured])
        axes[0].set_title('images/s vs torch fp32')
        axes[1].bar(labels, [1 - r['image_cosine_min'] for r in measured])
        axes[1].set_title('1 - min image cosine to fp32')
        for ax in axes:
            ax.tick_params(axis='x', rotation=30)

    return figure(path, draw, ncols=2, figsize=(10, 3.5))


def late_interaction(results: dict, path: Path) -> bool:
    def draw(axes):
        models = results['models']
        kinds = [(w, k) for k in ('pages_per_s', 'queries_per_s') for w in ('model_only', 'served')]
        series = {f'{w} {k.split("_")[0]}/s': [(r.get(w) or {}).get(k, 0) for r in models] for w, k in kinds}
        _bars(axes[0], [f'{r["kind"]} {r["model_only"]["dtype"]}' for r in models], series)
        axes[0].set_yscale('log')
        axes[0].legend(fontsize=7)
        axes[0].set_title(f'{results["size"]} size: items per second')
        rows = (results.get('storage') or {}).get('rows', [])
        axes[1].scatter([q['bytes_per_page'] for q in rows], [q['top10_agreement'] for q in rows])
        for q in rows:
            axes[1].annotate(q['variant'], (q['bytes_per_page'], q['top10_agreement']), fontsize=7)
        axes[1].set_xlabel('bytes per page')
        axes[1].set_ylabel('top-10 agreement with fp32')
        axes[1].set_title('pooling and storage')

    return figure(path, draw, ncols=2, figsize=(11, 4))


def bulk(results: dict, path: Path) -> bool:
    runs = results['runs']

    def draw(ax):
        ax.barh([r['engine'] for r in runs], [r['images_per_second'] for r in runs], color='tab:blue')
        ax.set_xlabel('images/s end to end (images + captions)')
        ax.set_title(f'bulk embedding, {results["images"]} images, {results["machine"]["cores"]} cores')
        ax.invert_yaxis()

    return figure(path, draw, figsize=(7, 3))


def search(results: dict, path: Path) -> bool:
    def draw(ax):
        for build in results['builds']:
            s = build['searches']
            ax.plot([x['recall_at_10'] for x in s], [x['qps'] for x in s], 'o-', label=f'{build["quantization"]}')
            for x in s:
                ax.annotate(str(x['ef_search']), (x['recall_at_10'], x['qps']), fontsize=7)
        ax.set_xlabel('recall@10')
        ax.set_ylabel('queries / s (one thread)')
        ax.set_title(f'{results["vectors"]:,} vectors: recall against speed by ef_search')
        ax.legend()

    return figure(path, draw)


def rerank(results: dict, path: Path) -> bool:
    def draw(ax):
        names = list(next(iter(results['lengths'].values()))['ratio_to_crossencoder'])
        series = {f'{t} tokens': [r['ratio_to_crossencoder'][n] for n in names] for t, r in results['lengths'].items()}
        _bars(ax, names, series)
        ax.axhline(1.0, color='grey', linewidth=0.8)
        ax.set_ylabel('pairs/s, x sentence-transformers CrossEncoder')
        ax.legend()

    return figure(path, draw)


def overload(results: dict, path: Path) -> bool:
    """RSS of each of the Flow's processes over the whole run, and each request's latency by when it was sent."""
    runs = results['runs'] + ([results['soak']] if results.get('soak') else [])

    def draw(axes):
        memory, latency = axes
        samples = results['rss_samples']
        for name in sorted({name for _, rss, _ in samples for name in rss}):
            points = [(t, rss[name]) for t, rss, _ in samples if name in rss]
            memory.plot([p[0] for p in points], [p[1] for p in points], label=name)
        for run in runs:
            memory.axvspan(run['started_at'], run['ended_at'], alpha=0.12)
            memory.text(run['started_at'], memory.get_ylim()[1] * 0.95, run['name'], fontsize=8)
        memory.set_xlabel('seconds')
        memory.set_ylabel('VmRSS MiB')
        memory.set_title('resident memory (shaded: open loops)')
        memory.legend(fontsize=8)
        colors = {'large': 'tab:blue', 'text': 'tab:orange', 'image': 'tab:green'}
        for kind, color in colors.items():
            for refused, marker in ((False, '.'), (True, 'x')):
                points = [
                    (run['started_at'] + o['sent'], o['ended'] - o['sent'])
                    for run in runs
                    for o in run['outcomes']
                    if o['kind'] == kind and o['ended'] is not None and (o['status'] in REFUSED_STATUSES) == refused
                ]
                if points:
                    latency.scatter(
                        [p[0] for p in points],
                        [p[1] for p in points],
                        s=6,
                        marker=marker,
                        color=color,
                        label=f'{kind}{" refused" if refused else ""}',
                    )
        limit = SMALL_P99_BATCHES * results['one_batch_s']
        latency.axhline(limit, color='red', lw=0.8, label=f'{SMALL_P99_BATCHES:g}x one batch (mean)')
        latency.set_yscale('log')
        latency.set_xlabel('sent at, seconds')
        latency.set_ylabel('latency s')
        latency.set_title('latency per request')
        latency.legend(fontsize=7, markerscale=2)

    return figure(path, draw, ncols=2, figsize=(14, 4.5))


def in_process(results: dict, path: Path) -> bool:
    """Texts/s and images/s of each configuration (in process and served), FastEmbed's first."""

    def draw(axes):
        for ax, kind, color in ((axes[0], 'texts', 'C0'), (axes[1], 'images', 'C2')):
            rates = results[kind]['rates']
            baseline = results[kind].get('baseline_name', 'FastEmbed')
            names = [baseline, *[k for k in rates if k != 'baseline']]
            ax.barh(
                names[::-1], [rates['baseline'], *[v for k, v in rates.items() if k != 'baseline']][::-1], color=color
            )
            ax.set_xlabel(f'{kind}/s')
            ax.tick_params(axis='y', labelsize=7)
        axes[0].set_title(f'texts ({results["texts_per_call"]} a call in process)', fontsize=9)
        axes[1].set_title(f'images ({results["images_per_call"]} a call)', fontsize=9)

    return figure(path, draw, ncols=2, figsize=(11, 3.8))


def request_overhead(results: dict, path: Path) -> bool:
    """Median latency of each route, and the CPU each process spent per request, stacked."""

    def draw(axes):
        names = list(results['routes'])
        rows = [results['routes'][n] for n in names]
        axes[0].barh(names[::-1], [r['median_ms'] for r in rows][::-1], color='C0')
        axes[0].set_xlabel('median latency, ms')
        left = [0.0] * len(rows)
        roles = sorted({role for r in rows for role in r['cpu_ms_per_request']})
        for i, role in enumerate(roles):
            widths = [r['cpu_ms_per_request'].get(role, 0.0) for r in rows]
            axes[1].barh(names[::-1], widths[::-1], left=left[::-1], label=role, color=f'C{i + 1}')
            left = [a + b for a, b in zip(left, widths)]
        axes[1].set_xlabel('CPU ms per request')
        axes[1].legend(fontsize=7)
        for ax in axes:
            ax.tick_params(axis='y', labelsize=7)

    return figure(path, draw, ncols=2, figsize=(12, 3.5))


def pass_size(results: dict, path: Path) -> bool:
    """Texts/s by rows a pass, and the time to read the text tower's weights in float32 and bfloat16."""

    def draw(axes):
        passes = results['passes']
        axes[0].bar(list(passes), [p['texts_per_s'] for p in passes.values()], color='C0')
        axes[0].set_xlabel('rows a pass')
        axes[0].set_ylabel('texts/s')
        axes[0].set_title(f'torch texts, {results["precision"]}', fontsize=9)
        weights, rows = results['weights'], results['tokens_per_caption']
        at = range(len(weights))
        axes[1].bar([i - 0.2 for i in at], [w['ms'] for w in weights.values()], 0.4, label=f'{rows} rows')
        axes[1].bar([i + 0.2 for i in at], [w['ms_4x_rows'] for w in weights.values()], 0.4, label=f'{4 * rows} rows')
        axes[1].set_xticks(list(at), list(weights))
        axes[1].set_ylabel('ms')
        axes[1].set_title("the text tower's weight matrices times the rows", fontsize=9)
        axes[1].legend(fontsize=7)

    return figure(path, draw, ncols=2, figsize=(10, 3.5))


DRAWERS = {
    f.__name__: f
    for f in (
        serving,
        precision,
        late_interaction,
        bulk,
        search,
        rerank,
        overload,
        in_process,
        request_overhead,
        pass_size,
    )
}


def draw_all(results_dir: Path, out_dir: Path) -> list[str]:
    """Draws `out_dir/NAME.png` for each `results_dir/NAME.json` with a drawer; the names drawn."""
    out_dir.mkdir(parents=True, exist_ok=True)
    drawn = []
    for name, drawer in DRAWERS.items():
        source = results_dir / f'{name}.json'
        if source.is_file() and drawer(json.loads(source.read_text()), out_dir / f'{name}.png'):
            drawn.append(name)
    return drawn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--results', type=Path, default=PUBLISHED, help='folder of NAME.json result files')
    parser.add_argument('--out', type=Path, default=Path(__file__).parent / 'results', help='where the PNGs go')
    args = parser.parse_args()
    drawn = draw_all(args.results, args.out)
    print(f'drew {", ".join(drawn) or "nothing"} into {args.out}')


if __name__ == '__main__':
    main()
