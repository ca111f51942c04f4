"""clipserve.json as a typed record: what the exporter writes is what the backends read."""

import json

import pytest

from clipserve.backends.export_format import (
    METADATA_FILE,
    ExportMetadata,
    clip_as_service_metadata,
    has_metadata,
    read_metadata,
    write_metadata,
)
from clipserve.errors import WeightsUnavailableError
from clipserve.models.preprocess import OPENAI_MEAN, OPENAI_STD


def test_round_trip_and_preprocessing(tmp_path):
    written = ExportMetadata(
        model='ViT-B-32::openai',
        image_size=224,
        mean=(0.5, 0.5, 0.5),
        std=(0.25, 0.25, 0.25),
        interpolation='bilinear',
        resize_mode='squash',
        embed_dim=512,
        context_length=32,
        dynamic_sequence=True,
        max_abs_diff={'visual': 1e-6},
    )
    write_metadata(tmp_path, written)
    assert has_metadata(tmp_path) and read_metadata(tmp_path) == written
    config = written.preprocess_config()
    assert (config.image_size, config.mean, config.interpolation, config.resize_mode) == (
        224,
        (0.5, 0.5, 0.5),
        'bilinear',
        'squash',
    )


def test_an_older_file_gets_the_defaults_and_a_newer_ones_extra_keys_are_ignored(tmp_path):
    (tmp_path / METADATA_FILE).write_text(
        json.dumps({'model': 'm', 'image_size': 224, 'mean': [0, 0, 0], 'std': [1, 1, 1], 'from_the_future': 1})
    )
    read = read_metadata(tmp_path)
    assert read.context_length == 77 and read.interpolation == 'bicubic' and not read.dynamic_sequence


@pytest.mark.parametrize('content', ['not json', '{"model": "m"}', '[]'])
def test_an_unreadable_file_is_a_clear_error(tmp_path, content):
    (tmp_path / METADATA_FILE).write_text(content)
    with pytest.raises(WeightsUnavailableError, match='clipserve.json.*re-export'):
        read_metadata(tmp_path)


def test_clip_as_service_folders_get_their_conventions(tmp_path):
    table = clip_as_service_metadata('RN50x4::openai', tmp_path, None, 640)
    assert (table.image_size, table.mean, table.std, table.context_length, table.embed_dim) == (
        288,
        OPENAI_MEAN,
        OPENAI_STD,
        77,
        640,
    )
    graph = clip_as_service_metadata(None, tmp_path / 'my-model', 336, None)
    assert graph.model == 'my-model' and graph.image_size == 336 and graph.embed_dim is None
