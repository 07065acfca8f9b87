"""The doctor's network checks that need no cluster (``refddp/launch/network_checks.py``)."""

from refddp.launch.network_checks import duplicate_host_names, gloo_interface, interfaces


def test_nodes_sharing_a_host_name_are_named_and_ranks_of_one_node_are_not():
    reports = [{"host": "a", "node_rank": 0}, {"host": "a", "node_rank": 0},
               {"host": "b", "node_rank": 1}, {"host": "a", "node_rank": 2}]  # fmt: skip
    [line] = duplicate_host_names(reports)
    assert line.startswith("nodes [0, 2] share the host name a:")
    assert duplicate_host_names(reports[:3]) == []


def test_loopback_is_a_problem_only_for_a_job_of_several_nodes(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setattr("socket.gethostname", lambda: "localhost")
    have = interfaces()
    assert "lo" in have and have["lo"] == "127.0.0.1"
    where, found = gloo_interface("n", have, multi_node=False)
    assert found == [] and where["interface"] == "lo"
    _, found = gloo_interface("n", have, multi_node=True)
    assert len(found) == 1 and "resolves to 127.0.0.1 (loopback)" in found[0]
