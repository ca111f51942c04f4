import base64
import os

import pytest

from clipserve.uris import UriError, UriPolicy, decode_data_uri


def test_data_uris_are_always_allowed():
    payload = b'\x89PNG not really'
    uri = 'data:image/png;base64,' + base64.b64encode(payload).decode()
    assert UriPolicy().load(uri) == payload
    assert decode_data_uri('data:text/plain,hello%20world', 100) == b'hello world'


@pytest.mark.parametrize('uri, reason', [
    ('data:image/png;base64', 'no comma'),
    ('data:image/png;base64,@@@@', 'malformed base64'),
])
def test_malformed_data_uris(uri, reason):
    with pytest.raises(UriError, match=reason):
        UriPolicy().load(uri)


def test_huge_data_uri_is_refused_before_decoding():
    uri = 'data:image/png;base64,' + 'A' * 2_000_000
    with pytest.raises(UriError, match='larger than the limit'):
        UriPolicy(max_bytes=1_000_000).load(uri)


def test_local_files_and_remote_urls_are_off_by_default(tmp_path):
    f = tmp_path / 'x.jpg'
    f.write_bytes(b'abc')
    for uri in (str(f), f'file://{f}'):
        with pytest.raises(UriError, match='allow_local_files'):
            UriPolicy().load(uri)
    with pytest.raises(UriError, match='allow_remote_uris'):
        UriPolicy().load('http://example.com/x.jpg')
    with pytest.raises(UriError, match='unsupported URI scheme'):
        UriPolicy().load('ftp://example.com/x.jpg')


def test_local_files_confined_to_root(tmp_path):
    root = tmp_path / 'images'
    root.mkdir()
    (root / 'ok.jpg').write_bytes(b'ok')
    (tmp_path / 'secret').write_bytes(b'secret')
    os.symlink(tmp_path / 'secret', root / 'link.jpg')
    policy = UriPolicy(allow_local_files=True, local_files_root=str(root))
    assert policy.load(str(root / 'ok.jpg')) == b'ok'
    assert policy.load(f'file://{root}/ok.jpg') == b'ok'
    for escape in (str(root / '..' / 'secret'), str(root / 'link.jpg'), '/etc/passwd'):
        with pytest.raises(UriError, match='outside the directory'):
            policy.load(escape)
    with pytest.raises(UriError, match='no such file'):
        policy.load(str(root / 'missing.jpg'))


@pytest.mark.parametrize('url', ['http://127.0.0.1:1/x.jpg', 'http://localhost:1/x.jpg',
                                 'http://169.254.169.254/latest/meta-data', 'http://10.0.0.1/x.jpg'])
def test_remote_fetches_refuse_non_public_addresses(url):
    with pytest.raises(UriError, match='non-public address'):
        UriPolicy(allow_remote=True).load(url)
