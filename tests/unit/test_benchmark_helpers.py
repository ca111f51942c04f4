"""The benchmark's measuring helpers: bracketed ratios and sustained rates (what the README's ratios rest on)."""

import time

import pytest

from benchmarks.common import bracketed, sustained_rate

from ..conftest import TINY


def test_bracketed_ratios_cancel_a_steady_drift_in_the_machine_speed():
    def drifting():  # each window runs on a machine 5 % (of its first speed) slower than the last
        clock = iter(range(100))
        return lambda true_rate: lambda: true_rate * (1 - 0.05 * next(clock))

    window = drifting()
    ratios, values = bracketed(window(100.0), {'served': window(90.0), 'one client': window(60.0)}, rounds=3)
    assert ratios == {'served': pytest.approx(0.9), 'one client': pytest.approx(0.6)}
    assert set(values) == {'baseline', 'served', 'one client'}
    # the plain quotient of the medians, which the old way reported, is off by the drift
    assert values['served'] / values['baseline'] != pytest.approx(0.9, abs=0.02)


def test_bracketed_takes_the_baseline_around_every_measure():
    order = []
    bracketed(
        lambda: order.append('b') or 1.0,
        {'x': lambda: order.append('x') or 1.0, 'y': lambda: order.append('y') or 1.0},
        rounds=2,
    )
    assert order == ['b', 'x', 'b', 'y', 'b'] * 2


def test_sustained_rate_counts_items_over_elapsed_time():
    rate = sustained_rate(lambda: time.sleep(0.01), items=5, seconds=0.2)
    assert 0 < rate <= 500  # 5 items per call of at least 10 ms


def test_save_plot_writes_a_png_next_to_the_json(tmp_path):
    pytest.importorskip('matplotlib')  # the `bench` extra
    from benchmarks.common import save_plot

    save_plot(tmp_path / 'result.json', lambda ax: ax.bar([0, 1], [3, 4]))
    assert (tmp_path / 'result.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_fastembed_tokenizer_files_tokenize_as_clipserve(tmp_path):
    """The tokenizer.json that FastEmbed is given for clipserve's export gives the Tokenizer's ids, mask and truncation."""
    tokenizers = pytest.importorskip('tokenizers')
    from benchmarks.fastembed_text import CHECK_TEXTS, write_tokenizer_files
    from clipserve.models.tokenizer import Tokenizer

    theirs = tokenizers.Tokenizer.from_file(str(write_tokenizer_files(tmp_path)))
    texts = [
        *CHECK_TEXTS,
        'Crème brûlée à la carte, s’il vous plaît; ÉLAN — Ärger über Öl?!',
        "rock'n'roll isn't it... (yes) -- 100% <b>bold</b>",
        'HELLO <END_OF_TEXT> World',
        'x' * 3000,  # one word far longer than the context
        'a very long caption, ' * 60,  # far more than 75 tokens
    ]
    ours = Tokenizer()(texts)
    encoded = theirs.encode_batch(texts)
    for row, text in enumerate(texts):
        n = int(ours.lengths[row])
        assert encoded[row].ids[:n] == ours.input_ids[row, :n].tolist(), text
        assert encoded[row].attention_mask == ours.attention_mask[row, : len(encoded[row].ids)].tolist(), text
    assert max(len(e.ids) for e in encoded) == 77  # padded to the longest, which is truncated to the context
    assert {e.ids[-1] for e in encoded if sum(e.attention_mask) == 77} == {49407}  # truncated rows end in <eot>


def test_pass_size_reads_every_weight_matrix_of_the_text_tower_in_each_precision(tiny_backend):
    from benchmarks.pass_size import loaded_model, text_weights, weight_reads
    from clipserve.backends.torch.packed_weights import onednn_computes_bf16

    weights = text_weights(loaded_model(TINY))
    matrices = [p for name, p in tiny_backend.model.transformer.named_parameters() if p.ndim == 2]
    assert weights and len(weights) == len(matrices)  # in_proj, out_proj, c_fc, c_proj of every block
    run32, mb32 = weight_reads(weights, 3, 'float32')
    run16, mb16 = weight_reads(weights, 3, 'bfloat16')
    assert mb32 == pytest.approx(sum(p.numel() for p in matrices) * 4 / 1e6) and mb16 == pytest.approx(mb32 / 2)
    run32(), run16()  # each multiplies rows of every weight matrix's width without a shape error
    if onednn_computes_bf16():
        run_packed, mb_packed = weight_reads(weights, 3, 'bfloat16, packed')
        assert mb_packed == mb16
        run_packed()
    assert text_weights(object()) == []  # a model without open_clip's text transformer: no weights measure
