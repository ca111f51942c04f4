"""A replica's admission (engine/admission.py): requests and documents in flight are bounded, and past the
bound a clear retryable refusal; small requests (a query, a caption) keep places of their own, so large
requests that fill a replica cannot refuse them."""

import pytest

from clipserve.engine.admission import SMALL_REQUEST_DOCUMENTS, Admission, Limits
from clipserve.errors import OverloadedError


def test_past_max_requests_a_large_request_is_refused_naming_the_limit_and_when_to_retry():
    admission = Admission(Limits(max_requests=2, small_reserve=0))
    assert admission.enter(8) is False and admission.enter(8) is False
    with pytest.raises(OverloadedError) as refused:
        admission.enter(8)
    assert refused.value.limit == 'max_requests' and refused.value.retry_after == 1.0 and refused.value.retryable
    assert 'max_requests=2' in str(refused.value) and 'retry after 1s' in str(refused.value)
    admission.leave(8)
    admission.enter(8)  # the place it left
    assert (admission.requests, admission.documents, admission.refused) == (2, 16, 1)


def test_small_requests_take_the_reserve_when_large_ones_fill_the_replica():
    admission = Admission(Limits(max_requests=2, small_reserve=3))
    admission.enter(8), admission.enter(8)
    with pytest.raises(OverloadedError):
        admission.enter(SMALL_REQUEST_DOCUMENTS + 1)  # not small: refused
    taken = [admission.enter(1), admission.enter(SMALL_REQUEST_DOCUMENTS), admission.enter(2)]
    assert taken == [True, True, True] and admission.small == 3 and admission.requests == 5
    with pytest.raises(OverloadedError) as refused:
        admission.enter(1)  # the reserve is full too
    assert 'max_requests=2' in str(refused.value) and '3 small ones in its reserve of 3' in str(refused.value)
    admission.leave(1, reserved=True)
    assert admission.enter(1) is True  # the reserve place it left
    with pytest.raises(OverloadedError):
        admission.enter(8)  # a place of the reserve is never a large request's


def test_a_large_request_that_leaves_frees_an_ordinary_place_while_small_ones_hold_the_reserve():
    admission = Admission(Limits(max_requests=2, small_reserve=2))
    admission.enter(8), admission.enter(8)
    assert admission.enter(1) is True
    admission.leave(8)
    assert admission.enter(8) is False  # an ordinary place again
    with pytest.raises(OverloadedError):
        admission.enter(8)
    admission.leave(1, reserved=True)
    assert (admission.requests, admission.small) == (2, 0)


def test_a_small_request_below_the_limit_takes_an_ordinary_place():
    admission = Admission(Limits(max_requests=2, small_reserve=1))
    assert admission.enter(1) is False and admission.small == 0


def test_the_document_bound_holds_for_small_requests_too():
    admission = Admission(Limits(max_requests=1, max_documents=10, small_reserve=4))
    admission.enter(10)
    with pytest.raises(OverloadedError) as refused:
        admission.enter(1)
    assert refused.value.limit == 'max_documents'
