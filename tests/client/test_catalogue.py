"""Gate.tools(): the tenant's catalogue over GET /v1/tools, against a live server."""

from __future__ import annotations

import pytest
from cosigner_client import AsyncGate, Gate, GateError

from tests.client.conftest import Live
from tests.conftest import free_port


def test_tools_tells_which_names_are_denied_outright(live: Live) -> None:
    with Gate(live.url, live.runtime) as gate:
        catalogue = gate.tools()
    assert catalogue.policy is not None and catalogue.tools is not None
    assert catalogue.tools["issue_refund"] == "financial"
    assert not catalogue.denies_outright("get_order")
    assert catalogue.denies_outright("delete_customer")


async def test_async_tools_and_an_unreachable_server(live: Live) -> None:
    async with AsyncGate(live.url, live.runtime) as gate:
        assert (await gate.tools()).tools is not None
    async with AsyncGate(f"http://127.0.0.1:{free_port()}", live.runtime,
                         timeout=0.5) as gate:
        with pytest.raises(GateError) as info:
            await gate.tools()
    assert info.value.code == "unavailable"
