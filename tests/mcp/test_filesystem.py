"""cosigner-mcp-gate around the real, unmodified npm ``@modelcontextprotocol/server-filesystem``
with the shipped ``rego/mcp_filesystem`` policy, driven by the ``mcp`` SDK's client.

The server is given a broader directory (``space``) than the policy's root
(``space/root``), so the server itself would happily touch ``space/outside.txt``: when
such a call fails, it is Cosigner that refused it, and ``tap.py``'s record of what the
server was sent proves the call never reached it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp_types import CallToolResult, TextContent

from tests.mcp.conftest import Cosigner, Tap, cosigner_for, filesystem_bundle, gate_session

pytestmark = pytest.mark.timeout(120)
GATE = ("--server-name", "filesystem", "--progress-interval", "0.5")


def text(result: Any) -> str:
    assert isinstance(result, CallToolResult)
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


@pytest.fixture(scope="module")
def space(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The server's directory; the policy's root is ``space/root`` (shared by the
    module's tests, each writing its own file names)."""
    space = tmp_path_factory.mktemp("space")
    (space / "root").mkdir()
    (space / "root" / "notes.txt").write_text("charged twice: ord_8472\n")
    (space / "secret.txt").write_text("outside the root\n")
    return space


@pytest.fixture(scope="module")
def shared(module_server: Callable[[Path], tuple[str, str]], space: Path,
           tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    return module_server(filesystem_bundle(tmp_path_factory.mktemp("bundles"),
                                           root=space / "root"))


@pytest.fixture
def cosigner(shared: tuple[str, str], tenant: str) -> Cosigner:
    return cosigner_for(shared, tenant)


async def test_allowed_read_returns_the_real_file(cosigner: Cosigner, space: Path,
                                                  filesystem_server: list[str], tap: Tap
                                                  ) -> None:
    server = tap.command([*filesystem_server, str(space)])
    async with gate_session(cosigner.url, cosigner.runtime, server, *GATE) as session:
        listed = {t.name for t in (await session.list_tools()).tools}
        assert {"read_text_file", "write_file", "move_file"} <= listed  # passed through
        result = await session.call_tool("read_text_file",
                                         {"path": str(space / "root" / "notes.txt")})
    assert not result.is_error, text(result)
    assert text(result) == "charged twice: ord_8472\n"
    assert [c["name"] for c in tap.tool_calls()] == ["read_text_file"]


async def test_write_waits_for_a_maintainer_then_writes_once(
        cosigner: Cosigner, space: Path, filesystem_server: list[str], tap: Tap) -> None:
    target = space / "root" / "refund-note.txt"
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    async def approve_when_asked() -> dict[str, Any]:
        for _ in range(200):
            items = await asyncio.to_thread(cosigner.pending)
            if items:
                assert not target.exists()  # nothing written while pending
                resp = await asyncio.to_thread(cosigner.review, items[0]["id"])
                assert resp.status_code == 200, resp.text
                return items[0]
            await asyncio.sleep(0.1)
        raise AssertionError("no approval request appeared")

    server = tap.command([*filesystem_server, str(space)])
    async with gate_session(cosigner.url, cosigner.runtime, server, *GATE) as session:
        approver = asyncio.create_task(approve_when_asked())
        result = await session.call_tool("write_file", {"path": str(target),
                                                        "content": "refund re_1 issued\n"},
                                         progress_callback=on_progress)
        approval = await approver
    assert not result.is_error, text(result)
    assert target.read_text() == "refund re_1 issued\n"
    writes = [c for c in tap.tool_calls() if c["name"] == "write_file"]
    assert len(writes) == 1 and writes[0]["arguments"]["path"] == str(target)
    # What the maintainer approved is exactly what ran, under the gate's identities.
    assert approval["tool"] == "filesystem.write_file"
    assert approval["args"] == {"path": str(target), "content": "refund re_1 issued\n"}
    assert approval["principal"]["id"] == "dev-1" and approval["initiator"]["id"] == "agent-1"
    assert progress and "maintainer" in (progress[0][2] or "")
    assert approval["review_url"] in (progress[0][2] or "")
    state = cosigner.get(f"/v1/approvals/{approval['id']}")
    assert state["status"] == "approved"
    assert cosigner.outcomes() == [("filesystem.write_file", "ok", "committed")]


@pytest.mark.parametrize("tool, args", [
    ("write_file", {"path": "{root}/../outside.txt", "content": "x"}),
    ("write_file", {"path": "{space}/outside.txt", "content": "x"}),
    ("read_text_file", {"path": "{root}/../secret.txt"}),
    ("move_file", {"source": "{root}/notes.txt", "destination": "{space}/outside.txt"}),
    ("create_directory", {"path": "{root}/a/../../outside.txt"}),
])
async def test_denied_paths_never_reach_the_server(cosigner: Cosigner, space: Path,
                                                   filesystem_server: list[str], tap: Tap,
                                                   tool: str, args: dict[str, str]) -> None:
    args = {k: v.format(root=space / "root", space=space) for k, v in args.items()}
    server = tap.command([*filesystem_server, str(space)])
    async with gate_session(cosigner.url, cosigner.runtime, server, *GATE) as session:
        result = await session.call_tool(tool, args)
    assert result.is_error
    assert "outside_root" in text(result) and "not run" in text(result)
    assert result.meta is not None and result.meta["cosigner"]["code"] == "outside_root"
    assert not (space / "outside.txt").exists()
    assert (space / "root" / "notes.txt").exists()
    assert tap.tool_calls() == []  # the server was never sent a tools/call


async def test_arguments_outside_the_catalogue_schema_are_refused(
        cosigner: Cosigner, space: Path, filesystem_server: list[str], tap: Tap) -> None:
    server = tap.command([*filesystem_server, str(space)])
    async with gate_session(cosigner.url, cosigner.runtime, server, *GATE) as session:
        result = await session.call_tool("read_text_file", {
            "path": str(space / "root" / "notes.txt"), "also": str(space / "secret.txt")})
    assert result.is_error and "refused to decide" in text(result)
    assert result.meta is not None and result.meta["cosigner"]["code"] == "invalid_args"
    assert tap.tool_calls() == []


async def test_rejected_write_is_a_tool_error_and_writes_nothing(
        cosigner: Cosigner, space: Path, filesystem_server: list[str], tap: Tap) -> None:
    target = space / "root" / "nope.txt"

    async def reject_when_asked() -> None:
        for _ in range(200):
            items = await asyncio.to_thread(cosigner.pending)
            if items:
                await asyncio.to_thread(cosigner.review, items[0]["id"], "rejected")
                return
            await asyncio.sleep(0.1)

    server = tap.command([*filesystem_server, str(space)])
    async with gate_session(cosigner.url, cosigner.runtime, server, *GATE) as session:
        rejecter = asyncio.create_task(reject_when_asked())
        result = await session.call_tool("write_file", {"path": str(target), "content": "x"})
        await rejecter
    assert result.is_error and "rejected" in text(result)
    assert result.meta is not None and result.meta["cosigner"]["code"] == "approval_rejected"
    assert not target.exists() and tap.tool_calls() == []


async def test_pending_approval_times_out_with_the_review_link_then_resumes(
        cosigner: Cosigner, space: Path, filesystem_server: list[str], tap: Tap) -> None:
    target = space / "root" / "later.txt"
    args = {"path": str(target), "content": "approved after the wait\n"}
    server = tap.command([*filesystem_server, str(space)])
    async with gate_session(cosigner.url, cosigner.runtime, server, *GATE,
                            "--approval-timeout", "1") as session:
        first = await session.call_tool("write_file", args)
        assert first.is_error and "still pending" in text(first)
        pending = cosigner.pending()
        assert len(pending) == 1 and pending[0]["review_url"] in text(first)
        assert first.meta is not None
        assert first.meta["cosigner"]["approval_id"] == pending[0]["id"]
        assert not target.exists() and tap.tool_calls() == []
        assert cosigner.review(pending[0]["id"]).status_code == 200
        again = await session.call_tool("write_file", args)  # same call: resumes, runs
    assert not again.is_error, text(again)
    assert target.read_text() == "approved after the wait\n"
    assert len(tap.tool_calls()) == 1 and cosigner.pending() == []


async def test_client_cancelling_a_pending_call_stops_it(
        cosigner: Cosigner, space: Path, filesystem_server: list[str], tap: Tap) -> None:
    target = space / "root" / "cancelled.txt"
    server = tap.command([*filesystem_server, str(space)])
    async with gate_session(cosigner.url, cosigner.runtime, server, *GATE) as session:
        with anyio.move_on_after(3) as waiting:  # abandoning sends notifications/cancelled
            await session.call_tool("write_file", {"path": str(target), "content": "x"})
        assert waiting.cancelled_caught
        [pending] = cosigner.pending()
        assert cosigner.review(pending["id"]).status_code == 200
        await asyncio.sleep(1.5)  # an uncancelled gate would redeem and write now
        read = await session.call_tool("read_text_file",
                                       {"path": str(space / "root" / "notes.txt")})
        assert not read.is_error  # the session goes on
    assert not target.exists()
    assert [c["name"] for c in tap.tool_calls()] == ["read_text_file"]
