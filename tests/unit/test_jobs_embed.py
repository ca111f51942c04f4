"""`python -m clipserve embed` end to end in this process (decoding inline, --workers 0; the worker processes,
the kill-and-resume and Ray are in tests/integration/test_bulk_*.py): the layout, the rows, the errors, the
vectors against the served model's, an index built from the output as autofaiss builds it, and resuming."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest

from clipserve.jobs.cli import main as embed

from ..bulk_collection import TINY, caption, cosines, files_of, image_bytes, make_folder, make_tar, read_output

FAST = ['--model', TINY, '--workers', '0', '--quiet']


@pytest.fixture(scope='module')
def collection(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp('bulk') / 'images')


@pytest.fixture(scope='module')
def embedded(collection, tmp_path_factory):
    out = tmp_path_factory.mktemp('out') / 'embeddings'
    summary = embed([str(collection), '--output', str(out), '--shard-size', '16', *FAST])
    return out, summary


def test_a_folder_with_captions_and_a_corrupt_file_gives_40_aligned_rows_and_one_error(embedded, collection):
    out, summary = embedded
    assert (summary['rows'], summary['embedded'], summary['errors'], summary['shards_written']) == (41, 40, 1, 3)
    data = read_output(out)
    assert data['img'].shape == (40, 64) and data['img'].dtype == np.float16
    assert data['text'].shape == (40, 64) and data['text'].dtype == np.float16
    metadata = data['metadata']
    assert len(metadata) == 40
    assert list(metadata['image_path']) == [str(collection / f'img_{i:03d}.jpg') for i in range(40)]
    assert list(metadata['caption']) == [caption(i) for i in range(40)]
    assert list(metadata['position']) == list(range(1, 41))  # corrupt.jpg sorts first: position 0
    assert set(metadata['width']) == {96} and set(metadata['height']) == {72}
    assert metadata['error'].isna().all()
    [failed] = data['errors'].to_dict('records')
    assert failed['image_path'] == str(collection / 'corrupt.jpg') and failed['position'] == 0
    assert 'image header' in failed['error'] and failed['caption'] == 'a file that does not decode'
    np.testing.assert_allclose(np.linalg.norm(data['img'].astype(np.float32), axis=1), 1.0, atol=2e-3)
    assert sorted(p.name for p in (out / 'img_emb').iterdir()) == ['img_emb_0.npy', 'img_emb_1.npy', 'img_emb_2.npy']


def test_the_vectors_are_the_served_models(embedded, collection, tiny_backend):
    """Row k is what a replica of the same model answers for that image and caption, normalised."""
    from clipserve.models.preprocess import preprocess_bytes

    data = read_output(embedded[0])
    pixels = np.stack(
        [preprocess_bytes((collection / f'img_{i:03d}.jpg').read_bytes(), tiny_backend.preprocess) for i in (0, 13, 39)]
    )
    images = tiny_backend.encode_images(pixels)
    assert cosines(images, data['img'][[0, 13, 39]]).min() > 0.9999
    tokens = tiny_backend.tokenizer([caption(i) for i in (0, 13, 39)])
    texts = tiny_backend.encode_texts(tokens.input_ids, tokens.attention_mask)
    assert cosines(texts, data['text'][[0, 13, 39]]).min() > 0.9999


def test_an_index_built_from_the_output_finds_the_known_neighbour(embedded, collection):
    """What autofaiss does with the folder: every img_emb shard in name order into one inner-product index,
    ids mapped back to images through the metadata shards concatenated in the same order."""
    faiss = pytest.importorskip('faiss')
    data = read_output(embedded[0])
    vectors = np.ascontiguousarray(data['img'].astype(np.float32))
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    paths = list(data['metadata']['image_path'])
    query = paths.index(str(collection / 'img_007.jpg'))
    _, ids = index.search(vectors[query : query + 1], 2)
    assert [paths[i] for i in ids[0]] == [str(collection / 'img_007.jpg'), str(collection / 'img_039.jpg')]


def test_a_rerun_skips_finished_shards_and_changes_nothing(embedded, collection):
    out, _ = embedded
    before = files_of(out)
    summary = embed([str(collection), '--output', str(out), '--shard-size', '16', *FAST])
    assert (summary['shards_written'], summary['skipped_rows']) == (0, 41)
    assert files_of(out) == before


def test_a_shard_left_incomplete_is_redone_and_only_it(embedded, collection, tmp_path):
    import shutil

    out = tmp_path / 'copy'
    shutil.copytree(embedded[0], out)
    (out / 'metadata' / 'metadata_1.parquet').unlink()  # killed between renames: embeddings there, metadata not
    (out / 'img_emb' / '.img_emb_2.npy.1234.tmp').write_bytes(b'half a file')  # killed while writing
    summary = embed([str(collection), '--output', str(out), '--shard-size', '16', *FAST])
    assert (summary['shards_written'], summary['rows'], summary['skipped_rows']) == (1, 16, 25)
    assert files_of(out) == files_of(embedded[0])


def test_a_folder_of_another_job_is_refused_naming_the_flag_before_the_model_loads(embedded, collection, capsys):
    with pytest.raises(SystemExit) as stopped:
        embed([str(collection), '--output', str(embedded[0]), '--shard-size', '16', '--output-dtype', 'fp32', *FAST])
    assert stopped.value.code == 2
    message = capsys.readouterr().err
    assert "--output-dtype: 'fp16' then, 'fp32' now" in message and 'another --output' in message
    assert 'loading' not in message  # refused before the model was loaded
    with pytest.raises(SystemExit):
        embed([str(collection), '--output', str(embedded[0]), '--shard-size', '8', '--model', TINY, '--quiet'])
    assert '--shard-size: 16 then, 8 now' in capsys.readouterr().err


def test_only_the_folders_a_job_writes_exist(tmp_path):
    """Images alone: no text_emb/; no failed row: no errors/ (an empty parquet file per shard was noise)."""
    from ..bulk_collection import image_bytes

    folder = tmp_path / 'images'
    folder.mkdir()
    for i in range(3):
        (folder / f'{i}.jpg').write_bytes(image_bytes(i))
    out = tmp_path / 'out'
    summary = embed([str(folder), '--output', str(out), *FAST])
    assert summary['embedded'] == 3 and summary['load_seconds'] > 0
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ['img_emb', 'metadata']


def test_a_list_of_paths_with_captions_relative_to_the_list(collection, embedded, tmp_path):
    listing = tmp_path / 'list.txt'
    rel = f'{collection.name}/img_005.jpg'
    (tmp_path / collection.name).symlink_to(collection)
    listing.write_text(f'# a comment\n{rel}\t{caption(5)}\n{collection}/missing.jpg\tgone\n\n')
    summary = embed([str(listing), '--output', str(tmp_path / 'out'), '--output-dtype', 'fp32', *FAST])
    assert (summary['embedded'], summary['errors']) == (1, 1)
    data = read_output(tmp_path / 'out')
    assert data['img'].dtype == np.float32
    assert data['metadata']['image_path'][0] == str(tmp_path / rel)
    assert 'no such file' in data['errors']['error'][0]
    reference = read_output(embedded[0])
    assert cosines(data['img'], reference['img'][[5]])[0] > 0.999  # fp16 there, fp32 here


def test_a_csv_of_captions_embeds_texts_alone(tmp_path, embedded):
    table = tmp_path / 'captions.csv'
    with open(table, 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(['id', 'caption'])
        writer.writerows([[i, caption(i)] for i in range(3)] + [[3, '   ']])
    summary = embed([str(table), '--output', str(tmp_path / 'out'), '--modality', 'texts', *FAST])
    assert (summary['embedded'], summary['errors']) == (3, 1)
    data = read_output(tmp_path / 'out')
    assert data['img'] is None and data['text'].shape == (3, 64)
    assert not (tmp_path / 'out' / 'img_emb').exists() or not list((tmp_path / 'out' / 'img_emb').iterdir())
    assert 'no caption' in data['errors']['error'][0]
    assert cosines(data['text'], read_output(embedded[0])['text'][:3]).min() > 0.999


def test_parquet_with_image_bytes_and_hugging_face_structs(tmp_path, embedded):
    import pyarrow as pa
    import pyarrow.parquet as pq

    images = [image_bytes(i) for i in range(3)]
    pq.write_table(pa.table({'jpg': images, 'caption': [caption(i) for i in range(3)]}), tmp_path / 'a.parquet')
    structs = [{'bytes': images[0], 'path': 'img_000.jpg'}, {'bytes': b'not an image', 'path': 'bad.jpg'}]
    pq.write_table(pa.table({'image': structs, 'text': ['x', 'y']}), tmp_path / 'b.parquet')
    out = tmp_path / 'out'
    summary = embed([str(tmp_path / 'a.parquet'), '--output', str(out), '--image-column', 'jpg', *FAST])
    assert summary['embedded'] == 3
    assert cosines(read_output(out)['img'], read_output(embedded[0])['img'][:3]).min() > 0.999
    out_b = tmp_path / 'out-b'
    summary = embed([str(tmp_path / 'b.parquet'), '--output', str(out_b), '--modality', 'images', *FAST])
    data = read_output(out_b)
    assert (summary['embedded'], summary['errors']) == (1, 1)
    assert list(data['metadata']['image_path']) == ['img_000.jpg']
    assert data['errors']['image_path'][0] == 'bad.jpg' and 'Pillow' in data['errors']['error'][0]


def test_webdataset_shards_one_output_shard_each(tmp_path, embedded):
    make_tar(tmp_path / 'shard-00.tar', 0, 3)
    make_tar(tmp_path / 'shard-01.tar', 3, 3, without_image=4)
    out = tmp_path / 'out'
    summary = embed([str(tmp_path / 'shard-{00..01}.tar'), '--output', str(out), *FAST])
    assert (summary['shards_written'], summary['embedded'], summary['errors']) == (2, 5, 1)
    data = read_output(out)
    assert list(data['metadata']['position']) == [0, 1, 2, 3, 5]
    assert data['metadata']['image_path'][3] == f'{tmp_path / "shard-01.tar"}#000003'
    assert data['errors']['error'][0] == 'the row has no image'
    assert cosines(data['img'], read_output(embedded[0])['img'][[0, 1, 2, 3, 5]]).min() > 0.999


def test_inputs_that_cannot_be_planned_say_what_is_wrong(tmp_path, capsys):
    with pytest.raises(SystemExit):
        embed([str(tmp_path / 'nothing-here'), '--output', str(tmp_path / 'out'), *FAST])
    assert "input '" in capsys.readouterr().err
    table = tmp_path / 't.csv'
    table.write_text('a,b\n1,2\n')
    with pytest.raises(SystemExit):
        embed([str(table), '--output', str(tmp_path / 'out'), '--caption-column', 'caption', *FAST])
    assert "no column 'caption'" in capsys.readouterr().err
    empty = tmp_path / 'empty'
    empty.mkdir()
    with pytest.raises(SystemExit):
        embed([str(empty), '--output', str(tmp_path / 'out'), *FAST])
    assert 'no rows' in capsys.readouterr().err


def test_rows_are_checked_against_the_servers_limits(tmp_path):
    """The URI policy and size limits are the server's: a non-public address is refused before any connection,
    an image over --max-image-bytes is a row error, both with the server's reasons."""
    listing = tmp_path / 'urls.txt'
    big = tmp_path / 'big.png'
    big.write_bytes(image_bytes(1, 300, 300, 'PNG', noise=60))
    listing.write_text(f'http://127.0.0.1:9/x.jpg\n{big}\n')
    out = tmp_path / 'out'
    summary = embed([str(listing), '--output', str(out), '--max-image-bytes', '50000', *FAST])
    assert (summary['embedded'], summary['errors']) == (0, 2)
    errors = read_output(out)['errors']
    assert 'non-public address 127.0.0.1' in errors['error'][0] and errors['url'][0] == 'http://127.0.0.1:9/x.jpg'
    assert 'over the limit of 50000 bytes' in errors['error'][1] or 'larger than the limit' in errors['error'][1]


def test_the_image_bytes_helper_makes_distinct_pictures():
    from PIL import Image

    a, b = (np.asarray(Image.open(io.BytesIO(image_bytes(s)))) for s in (1, 2))
    assert a.shape == (72, 96, 3) and np.abs(a.astype(int) - b).mean() > 10
