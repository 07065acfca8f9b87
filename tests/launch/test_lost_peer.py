"""A collective that lost its peer names the node (``refddp.launch.exits.lost_peer``): gloo's message
names only an address; the host name comes from /etc/hosts, never from DNS."""

import pytest

from refddp.launch import exits
from refddp.launch.exits import lost_peer

GLOO = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[{}]:5279. This is typically caused by a remote worker crashing.")  # fmt: skip


@pytest.fixture
def hosts(tmp_path, monkeypatch):
    path = tmp_path / "hosts"
    path.write_text("127.0.0.1 localhost\n10.213.0.2 node1 node1.cluster  # the second node\n")
    real = exits._host_in_hosts_file
    monkeypatch.setattr(exits, "_host_in_hosts_file", lambda a: real(a, str(path)))


def test_the_lost_peer_is_named_by_host_name_and_address(hosts):
    line = lost_peer(RuntimeError(GLOO.format("10.213.0.2")))
    assert line is not None
    assert "lost the connection to node1 (10.213.0.2) in a collective (connection closed by peer)" in line


def test_an_address_not_in_the_hosts_file_is_named_as_it_is_and_a_wrapped_error_is_found(hosts):
    try:
        try:
            raise RuntimeError(GLOO.format("192.0.2.77").replace("closed", "reset"))
        except RuntimeError as exc:
            raise ValueError("step failed") from exc
    except ValueError as wrapped:
        line = lost_peer(wrapped)
    assert line is not None and "lost the connection to 192.0.2.77 in a collective" in line


@pytest.mark.parametrize("text", ["CUDA out of memory", "Connection closed by peer",
                                  "[1.2.3.4]:5", "urllib3: Read error [10.0.0.1]:443"])  # fmt: skip
def test_other_errors_are_not_taken_for_a_lost_peer(text):
    assert lost_peer(RuntimeError(text)) is None
