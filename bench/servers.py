"""Server processes under test: the floor app, ``cosigner serve`` and the peer.

A :class:`Deployment` is one system's server side: one or two processes, each on its
own loopback port, with its own fresh database (a temp SQLite file or a fresh
PostgreSQL database). Deployments are prepared once per bench run and started and
stopped around each of their turns, so only the system being measured is running.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
PEER_VENV = BENCH / ".venv-peer"
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


class SetupError(RuntimeError):
    """A system cannot be measured (missing dependency, failed start); the message says why."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Process:
    """One serving process on a loopback port."""

    cmd: list[str]
    env: dict[str, str]
    cwd: Path
    log: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, health: str = "/healthz") -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([*self.cmd, "--port", str(self.port)], env=self.env,
                                         cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SetupError(f"server exited ({self.proc.returncode}): {self.log_tail()}")
            try:
                if httpx.get(self.url + health, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise SetupError(f"server did not answer {health} within 60 s: {self.log_tail()}")

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def rss_mb(self) -> float:
        """VmRSS of the process from /proc/<pid>/status, in MB (2^20 bytes)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def cpu_s(self) -> float:
        """utime + stime of the process so far, in seconds (/proc/<pid>/stat)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Deployment:
    """One system's processes. Subclasses fill ``processes`` in :meth:`prepare`."""

    health = "/healthz"

    def __init__(self, name: str, processes: int = 1) -> None:
        self.name = name
        self.count = processes
        self.processes: list[Process] = []
        self.workdir = Path(tempfile.mkdtemp(prefix=f"cosigner-bench-{name}-"))

    def prepare(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        # One at a time: the first cosigner process creates the signing key the second reads.
        for process in self.processes:
            process.start(self.health)

    def stop(self) -> None:
        for process in self.processes:
            process.stop()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def urls(self) -> list[str]:
        return [p.url for p in self.processes]

    def rss_mb(self) -> float:
        return sum(p.rss_mb() for p in self.processes)

    def cpu_s(self) -> float:
        return sum(p.cpu_s() for p in self.processes)

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]


class FloorDeployment(Deployment):
    """``bench/floor_app.py`` in our venv, served like ``cosigner serve``."""

    def prepare(self) -> None:
        cmd = [sys.executable, str(BENCH / "serve_asgi.py"), "bench.floor_app:app"]
        self.processes = [Process(cmd, dict(os.environ), ROOT, self.workdir / f"floor{i}.log")
                          for i in range(self.count)]


class PeerDeployment(Deployment):
    """The Agent Governance Toolkit's ``agentmesh`` policy-server, from its own venv."""

    def prepare(self) -> None:
        python = ensure_peer_venv()
        env = dict(os.environ, AGENTMESH_POLICY_DIR=str(BENCH / "peer"),
                   PYTHONWARNINGS="ignore::DeprecationWarning")
        cmd = [str(python), str(BENCH / "serve_asgi.py"),
               "agentmesh.server.policy_server:app"]
        self.processes = [Process(cmd, env, self.workdir, self.workdir / "peer.log")]


class LeanProtoDeployment(Deployment):
    """``bench/lean_proto.py`` (issue 20's study design rebuilt as one raw ASGI callable)
    on a fresh SQLite file with one API key of ``tenant``, served like the floor."""

    def __init__(self, name: str, *, tenant: str) -> None:
        super().__init__(name)
        self.tenant = tenant
        self.key = ""

    def prepare(self) -> None:
        database, seed = self.workdir / "lean.db", self.workdir / "signing.seed"
        self.key = run([sys.executable, str(BENCH / "lean_proto.py"), "init", "--database",
                        str(database), "--signing-key", str(seed), "--tenant", self.tenant]
                       ).strip().splitlines()[-1]
        env = dict(os.environ, LEAN_PROTO_DATABASE=str(database),
                   LEAN_PROTO_SIGNING_KEY=str(seed))
        cmd = [sys.executable, str(BENCH / "serve_asgi.py"), "bench.lean_proto:app"]
        self.processes = [Process(cmd, env, ROOT, self.workdir / "lean-proto.log")]


class CosignerDeployment(Deployment):
    """``cosigner serve`` on a fresh SQLite file or a fresh PostgreSQL database."""

    health = "/healthz"

    def __init__(self, name: str, *, tenant: str, database: str = "sqlite",
                 processes: int = 1) -> None:
        super().__init__(name, processes)
        self.tenant = tenant
        self.database = database
        self.pg_name: str | None = None
        self.key = ""

    def prepare(self) -> None:
        if self.database == "postgres":
            ensure_postgres()
            self.pg_name = f"cosigner_bench_{os.getpid()}_{self.name.replace('-', '_')}"
            pg_admin(f'DROP DATABASE IF EXISTS "{self.pg_name}" WITH (FORCE)')
            pg_admin(f'CREATE DATABASE "{self.pg_name}"')
            url = f"postgresql+asyncpg://postgres@127.0.0.1:5432/{self.pg_name}"
        else:
            url = f"sqlite+aiosqlite:///{self.workdir / 'cosigner.db'}"
        env = dict(os.environ)
        env.update({
            "COSIGNER_DATABASE_URL": url,
            "COSIGNER_KEY_DIR": str(self.workdir / "keys"),
            "COSIGNER_LOG_LEVEL": "warning",
            "COSIGNER_BUNDLE_DIRS": json.dumps([str(ROOT / "policies"), str(ROOT / "rego")]),
            # Permits are minted a few seconds before the redeem cell; a day is plenty.
            "COSIGNER_PERMIT_TTL_S": "86400",
            # Throughput, not the rate limiter, is measured: limits far above any rate
            # reachable here, still counted on every request (0 would skip counting).
            "COSIGNER_RATE_LIMITS": json.dumps({"*": {
                "credential_per_s": 10**7, "credential_burst": 10**7,
                "tenant_per_s": 10**7, "tenant_burst": 10**7,
                "decisions_per_min": 10**9, "approvals_per_min": 10**9}}),
        })
        cli = [sys.executable, "-m", "cosigner"]
        run(cli + ["migrate"], env)
        self.key = run(cli + ["principals", "add-key", "--tenant", self.tenant,
                              "--role", "runtime", "--subject", "bench-runtime"],
                       env).strip().splitlines()[-1]
        self.processes = [Process(cli + ["serve", "--no-migrate"], env, ROOT,
                                  self.workdir / f"cosigner{i}.log")
                          for i in range(self.count)]

    def pg_cpu(self) -> dict[int, float]:
        """CPU seconds so far of each PostgreSQL process working for this deployment:
        the backends connected to its database plus the cluster's shared helpers (WAL
        writer, checkpointer, background writer), by pid; ``{}`` on SQLite."""
        if not self.pg_name:
            return {}
        return pg_cpu(self.pg_name)

    def cleanup(self) -> None:
        super().cleanup()
        if self.pg_name:
            try:
                pg_admin(f'DROP DATABASE IF EXISTS "{self.pg_name}" WITH (FORCE)')
            except SetupError as exc:
                print(f"warning: {exc}", file=sys.stderr)


class SeededCosignerDeployment(CosignerDeployment):
    """:class:`CosignerDeployment` on SQLite whose log already holds ``decisions`` allow
    decisions of its tenant, written through the real decide path by bench/storage.py
    (in process, before the server starts; not measured). ``report`` keeps what
    bench/storage.py printed: the bytes per allow decision after a WAL checkpoint."""

    def __init__(self, name: str, *, tenant: str, decisions: int) -> None:
        super().__init__(name, tenant=tenant)
        self.decisions = decisions
        self.report = ""

    def prepare(self) -> None:
        path, keys = self.workdir / "cosigner.db", self.workdir / "keys"
        cached = self._cached()
        if cached is not None and cached.exists():
            # a log seeded earlier by this same command at this schema (BENCH_SEED_CACHE)
            print(f"  {self.name}: the seeded log from {cached}", flush=True)
            shutil.copyfile(cached / "cosigner.db", path)
            shutil.copytree(cached / "keys", keys)
            super().prepare()
            self.report = run([sys.executable, str(ROOT / "bench" / "storage.py"),
                               "--database", str(path), "--report-only"])
        else:
            super().prepare()
            print(f"  seeding {self.name}: {self.decisions:,} decisions (bench/storage.py)",
                  flush=True)
            self.report = run([sys.executable, str(ROOT / "bench" / "storage.py"),
                               "--database", str(path), "--tenant", self.tenant,
                               "--decisions", str(self.decisions), "--key-dir", str(keys)])
            if cached is not None:
                staging = cached.with_name(cached.name + ".part")
                shutil.rmtree(staging, ignore_errors=True)
                staging.mkdir(parents=True)
                shutil.copyfile(path, staging / "cosigner.db")
                shutil.copytree(keys, staging / "keys")
                staging.rename(cached)
        (self.workdir / "storage.txt").write_text(self.report)
        print(self.report, flush=True)

    def _cached(self) -> Path | None:
        """Where the seeded log is kept between runs when ``BENCH_SEED_CACHE`` names a
        folder: one entry per tenant, count and schema head (the newest migration), so a
        change of what is stored seeds again."""
        folder = os.environ.get("BENCH_SEED_CACHE")
        if not folder:
            return None
        versions = ROOT / "cosigner" / "db" / "migrations" / "versions"
        head = max(p.stem for p in versions.glob("[0-9]*.py"))
        return Path(folder) / f"{self.tenant}-{self.decisions}-{head}"


def run(cmd: list[str], env: dict[str, str] | None = None) -> str:
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SetupError(f"{' '.join(cmd[:4])}... failed: {done.stderr[-1500:]}")
    return done.stdout


def pg_admin(sql: str) -> None:
    if shutil.which("psql") is None:
        raise SetupError("psql not found")
    run(["psql", PG_ADMIN, "-v", "ON_ERROR_STOP=1", "-qc", sql])


def pg_cpu(database: str) -> dict[int, float]:
    """utime + stime (s) by pid of ``database``'s backends and the cluster's auxiliary
    processes (pg_stat_activity; /proc/<pid>/stat). A backend that exits meanwhile is
    missed, so compare two calls pid by pid (:func:`pg_cpu_delta`)."""
    out = run(["psql", PG_ADMIN, "-AXtc",
               "SELECT pid FROM pg_stat_activity WHERE datname = "
               f"'{database}' OR backend_type IN ('walwriter', 'checkpointer', "
               "'background writer')"])
    ticks = os.sysconf("SC_CLK_TCK")
    cpu: dict[int, float] = {}
    for line in out.split():
        try:
            fields = Path(f"/proc/{int(line)}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, ValueError):
            continue
        cpu[int(line)] = (int(fields[11]) + int(fields[12])) / ticks
    return cpu


def pg_cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two :func:`pg_cpu` samples (a pid new in ``after``
    counts from zero)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def ensure_postgres() -> None:
    """PostgreSQL at 127.0.0.1:5432 (scripts/ensure-postgres.sh installs/starts it)."""
    ready = shutil.which("pg_isready") and subprocess.run(
        ["pg_isready", "-q", "-h", "127.0.0.1", "-p", "5432"]).returncode == 0
    if not ready:
        done = subprocess.run(["bash", str(ROOT / "scripts" / "ensure-postgres.sh")])
        if done.returncode != 0:
            raise SetupError("PostgreSQL is not available at 127.0.0.1:5432")


def ensure_wrk() -> str:
    """Path of ``wrk``, installing Debian's package when missing (as root)."""
    found = shutil.which("wrk")
    if found:
        return found
    print("installing wrk (Debian package)", file=sys.stderr)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], env=env, check=False)
    subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], env=env, check=False,
                   stdout=subprocess.DEVNULL)
    found = shutil.which("wrk")
    if not found:
        sys.exit("wrk is not installed and `apt-get install wrk` failed")
    return found


def _our_version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def ensure_peer_venv() -> Path:
    """``bench/.venv-peer`` with ``agent-governance-toolkit-core[api]``, kept apart from
    our venv. uvloop/httptools are pinned to our versions so both servers run on the
    same event loop and HTTP parser."""
    python = PEER_VENV / "bin" / "python"
    probe = [str(python), "-c", "import agentmesh.server.policy_server, uvicorn"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    print("installing the peer into bench/.venv-peer (agent-governance-toolkit-core[api])",
          file=sys.stderr)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
    extras = [f"{d}=={v}" for d in ("uvicorn", "uvloop", "httptools")
              if (v := _our_version(d))]
    done = subprocess.run([str(python), "-m", "pip", "install", "-q",
                           "agent-governance-toolkit-core[api]", *extras])
    if done.returncode != 0 or subprocess.run(probe, capture_output=True).returncode != 0:
        raise SetupError("could not install agent-governance-toolkit-core[api] "
                         "into bench/.venv-peer")
    return python


def post_json(url: str, body: dict[str, Any], key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(url, json=body, headers=headers, timeout=10)
