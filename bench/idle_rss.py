"""Idle RSS of a Python-rules-only ``cosigner serve`` (issue 20 target: ≤ 80 MB).

Starts one server on a fresh SQLite database with only ``policies/`` as bundle dir (the
Python-rule bundle ``refunds``; no Rego), waits for ``/healthz``, lets it settle and
prints VmRSS, whether ``regopy`` (rego-cpp) is mapped into the process, and VmRSS again
after 200 allow decisions. ``--floor`` also starts the bare FastAPI floor
(``bench/floor_app.py``, served the same way) and prints its idle VmRSS::

    .venv/bin/python bench/idle_rss.py [--settle 3] [--floor]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.servers import ROOT, CosignerDeployment, FloorDeployment  # noqa: E402


def mapped(pid: int, needle: str) -> bool:
    """True when a file whose path contains ``needle`` is mapped into process ``pid``."""
    return needle in Path(f"/proc/{pid}/maps").read_text()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settle", type=float, default=3.0, help="seconds before reading")
    parser.add_argument("--floor", action="store_true", help="also the bare FastAPI floor")
    args = parser.parse_args()
    if args.floor:
        floor = FloorDeployment("idle-rss-floor")
        try:
            floor.prepare()
            floor.start()
            time.sleep(args.settle)
            print(f"floor (bare FastAPI + uvicorn) idle RSS {floor.rss_mb():.1f} MB")
        finally:
            floor.cleanup()
    deployment = CosignerDeployment("idle-rss", tenant="bench")
    try:
        deployment.prepare()
        process = deployment.processes[0]
        process.env["COSIGNER_BUNDLE_DIRS"] = json.dumps([str(ROOT / "policies")])
        deployment.start()
        time.sleep(args.settle)
        idle = process.rss_mb()
        rego = mapped(process.pid, "regopy")
        headers = {"Authorization": f"Bearer {deployment.key}"}
        with httpx.Client(base_url=process.url, timeout=30) as client:
            for i in range(200):
                resp = client.post("/v1/decisions", headers=headers, json={
                    "request_id": f"idle-{uuid.uuid4().hex}-{i}",
                    "run": {"id": f"run-{i}"},
                    "principal": {"id": "customer-42", "type": "customer"},
                    "initiator": {"id": "agent-support", "type": "agent"},
                    "tool": {"name": "issue_refund", "side_effect": "financial"},
                    "args": {"order_id": "ord_8472", "amount_minor": 5000,
                             "currency": "USD", "reason_code": "duplicate_charge"}})
                if resp.status_code != 200 or resp.json()["effect"] != "allow":
                    raise SystemExit(f"decision failed: {resp.status_code} {resp.text}")
        busy = process.rss_mb()
        print(f"idle RSS {idle:.1f} MB (target <= 80), regopy loaded: {rego}; "
              f"after 200 decisions {busy:.1f} MB, regopy loaded: "
              f"{mapped(process.pid, 'regopy')}")
    finally:
        deployment.cleanup()


if __name__ == "__main__":
    main()
