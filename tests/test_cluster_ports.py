"""The test cluster's ports: no node's port may be another's cluster-bus port (port + 10000)."""

from __future__ import annotations

import pytest

from tests import cluster


def test_a_node_port_is_never_an_earlier_nodes_port_or_bus_port(monkeypatch: pytest.MonkeyPatch) -> None:
    # 44375's bus port is 54375, a node picked before; 44000 is 34000's bus port; 41000 is free
    offered = iter([44375, 34000 + 10000, 54375, 41000])
    monkeypatch.setattr(cluster, "_free_port", lambda: next(offered))
    monkeypatch.setattr(cluster, "_is_free", lambda _port: True)
    assert cluster._node_port([54375, 34000]) == 41000
