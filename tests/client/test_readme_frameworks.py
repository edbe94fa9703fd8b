"""The README's "Use it from your agent framework" examples run as written against a live
server, each with a scripted model standing for ``model`` (tests/client/agent_apps.py):
start → an approver approves through the API → resume (OpenAI Agents and LangGraph in a
fresh process) → the tool ran and the model read its result."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.client.conftest import REFUND, Live

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SCRIPTED = {"openai-agents": "openai_scripted_model", "langgraph": "langgraph_scripted_model",
            "pydantic-ai": "pydantic_scripted_model"}


def block(framework: str, part: str) -> str:
    found = re.search(rf"<!-- framework:{framework}:{part} -->\n```python\n(.*?)```",
                      README.read_text("utf-8"), re.S)
    assert found is not None, f"{framework}:{part} not in README.md"
    return found.group(1)


def prelude(framework: str) -> str:
    return (f"from tests.client.agent_apps import {SCRIPTED[framework]}\n"
            f"model = {SCRIPTED[framework]}('issue_refund', {REFUND!r})\n")


def run_here(code: str, namespace: dict[str, object]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - the README's code
    return out.getvalue()


def run_fresh(code: str, live: Live, cwd: Path) -> str:
    env = {**os.environ, "COSIGNER_URL": live.url, "COSIGNER_KEY": live.runtime,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "clients" / "python"), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def approve_printed(live: Live, printed: str) -> None:
    found = re.search(r"review: \S+/ui/approvals/([0-9a-f-]{36})", printed)
    assert found is not None, printed
    assert live.review(found.group(1)).status_code == 200


@pytest.fixture
def here(live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("COSIGNER_URL", live.url)
    monkeypatch.setenv("COSIGNER_KEY", live.runtime)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("framework", ["openai-agents", "langgraph"])
def test_readme_framework_example_resumes_in_a_fresh_process(
        framework: str, live: Live, here: Path) -> None:
    pytest.importorskip("agents" if framework == "openai-agents" else "langgraph")
    setup = prelude(framework) + block(framework, "setup")
    printed = run_here(setup + block(framework, "start"), {"__name__": "readme"})
    approve_printed(live, printed)
    resumed = run_fresh(setup + block(framework, "resume"), live, here)
    assert resumed.strip().splitlines()[-1] == "model read: refunded 200000 USD on ord_8472"


def test_readme_pydantic_ai_example(live: Live, here: Path) -> None:
    pytest.importorskip("pydantic_ai")
    namespace: dict[str, object] = {"__name__": "readme"}
    printed = run_here(prelude("pydantic-ai") + block("pydantic-ai", "setup")
                       + block("pydantic-ai", "start"), namespace)
    approve_printed(live, printed)
    resumed = run_here(block("pydantic-ai", "resume"), namespace)
    assert resumed.strip() == "model read: refunded 200000 USD on ord_8472"


def test_readme_decorator_example(live: Live, here: Path) -> None:
    printed = run_here(block("decorator", "start"), {"__name__": "readme"})
    assert "'tool_use_id': 'toolu_1'" in printed and "'is_error': True" in printed
    assert "Cosigner denied this call (over_hard_limit" in printed
