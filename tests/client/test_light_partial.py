"""encode_partial's bookkeeping (clipserve_client.partial): which inputs are sent again after a refusal, with
the server's answers built by hand; the real server's refusals are in test_light_flows.py."""

import numpy as np
import pytest

from clipserve_client import BadRequestError, InternalServerError, ItemError, RequestTooLargeError
from clipserve_client.partial import Pieces, gather


def rows(part):
    return np.array([[float(i), 1.0] for i in part], np.float32)


def drive(pieces: Pieces, refuse) -> list[list[int]]:
    """Send every part `pieces` asks for; `refuse(part)` is the error the server answers, or None."""
    sent = []
    while (part := pieces.next()) is not None:
        sent.append(part)
        error = refuse(part)
        if error is None:
            pieces.answered(part, rows(part))
        else:
            pieces.refused(part, error)
    return sent


def test_the_items_the_server_names_fail_and_the_rest_is_sent_again():
    pieces = Pieces(10, [{'text': str(i)} for i in range(5)])

    def refuse(part):
        bad = [k for k, position in enumerate(part) if position in (1, 3)]
        items = tuple(ItemError(k, f'bad {part[k]}', f'input[{k}]') for k in bad)
        return BadRequestError(400, 'input[...]: bad', items=items) if items else None

    assert drive(pieces, refuse) == [[0, 1, 2, 3, 4], [0, 2, 4]]
    result = gather([pieces])
    assert result.indices == [10, 12, 14] and result.vectors[:, 0].tolist() == [0, 2, 4]
    assert result.failed == {11: 'the server refused it: bad 1', 13: 'the server refused it: bad 3'}


def test_a_refusal_that_names_nothing_is_split_until_the_bad_input_is_alone():
    pieces = Pieces(0, [{'text': str(i)} for i in range(6)])

    def refuse(part):  # a request over the server's byte limit, or a server that does not name items
        return RequestTooLargeError(413, 'the request is too large') if 4 in part else None

    sent = drive(pieces, refuse)
    assert sent[0] == [0, 1, 2, 3, 4, 5] and [4] in sent
    result = gather([pieces])
    assert result.indices == [0, 1, 2, 3, 5] and result.failed == {4: 'the server refused it: the request is too large'}


def test_inputs_unreadable_here_are_never_sent():
    pieces = Pieces(0, [{'text': 'a'}, FileNotFoundError('input 1: no such file'), {'text': 'c'}])
    assert drive(pieces, lambda part: None) == [[0, 2]]
    assert gather([pieces]).failed == {1: 'input 1: no such file'}
    nothing = Pieces(0, [ValueError('input 0: empty')])
    assert nothing.next() is None and gather([nothing]).vectors.shape == (0, 0)


@pytest.mark.parametrize('status', [401, 404, 429, 500, 503])
def test_an_error_that_is_not_about_inputs_is_raised(status):
    pieces = Pieces(0, [{'text': 'a'}, {'text': 'b'}])
    error = InternalServerError(status, 'no')
    with pytest.raises(InternalServerError):
        pieces.refused(pieces.next(), error)
