"""The gRPC server options clipserve gives Jina's servers (jina_compat.py), seen from a client's side:
Jina's own clients keep an idle connection, and an oversized message is refused before it is read."""

import time

import grpc
import pytest
from jina.serve.helper import get_default_grpc_options

from .conftest import TINY, flow_from_yaml, free_port, health, set_port, wait_for


@pytest.fixture(scope='module')
def torch_flow(tmp_path_factory):
    port = free_port()
    with flow_from_yaml(
        'torch.yml', tmp_path_factory.mktemp('flows'), lambda c: set_port(c, port), {'CLIPSERVE_MODEL': TINY}
    ):
        wait_for(lambda: health(port) == 'SERVING', 60, 'the Flow to be ready')
        yield port


def test_a_client_pinging_as_jinas_clients_mean_to_keeps_its_connection(torch_flow):
    """Jina's clients ping every 10 s and mean to do so without data (their `grpc.http1.*` spelling of the
    option is ignored, which happens to stop them after two pings). gRPC's default server policy allows one
    ping per 5 minutes without data and answers the third strike with GOAWAY too_many_pings (seen in the
    serving benchmark); clipserve's servers allow what the clients send."""
    options = [*get_default_grpc_options(), ('grpc.http2.max_pings_without_data', 0)]
    channel = grpc.insecure_channel(f'127.0.0.1:{torch_flow}', options=options)
    states = []
    channel.subscribe(states.append, try_to_connect=True)
    grpc.channel_ready_future(channel).result(timeout=10)
    time.sleep(45)  # four of the client's keepalive pings, no call
    channel.close()
    ready = states.index(grpc.ChannelConnectivity.READY)
    assert states[ready:] == [grpc.ChannelConnectivity.READY], f'the connection was dropped: {states}'
