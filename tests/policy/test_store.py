"""PolicyStore with Rego bundles: atomic reload, refusal keeps the old version serving."""

from __future__ import annotations

import shutil
from pathlib import Path

from cosigner.policy.cases import check_bundle, with_defaults
from cosigner.policy.opa_engine import OpaEngine
from cosigner.policy.store import PolicyStore, engine_factory
from tests.policy.conftest import REFUNDS_PY, REFUNDS_REGO, manifest, write_bundle

GOOD = 'package cosigner.test\n\ndecision := {"effect": "allow", "reasons": ["v1"]}\n'
GOOD_V2 = 'package cosigner.test\n\ndecision := {"effect": "deny", "reasons": ["v2"]}\n'
BROKEN = 'package cosigner.test\n\ndecision := {"effect": "allow" if {\n'
INPUT = with_defaults({"tool": {"name": "get_order"}, "args": {"order_id": "ord_1"}})


def rego_bundle(
    root: Path,
    source: str,
    *,
    version: str = "1.0.0",
    extra: str = "",
    files: dict[str, str] | None = None,
) -> Path:
    return write_bundle(
        root,
        "b",
        {
            "manifest.toml": manifest(id="b", version=version, extra=extra),
            "policy.rego": source,
            **(files or {}),
        },
    )


async def test_malformed_rego_is_refused_while_the_old_version_keeps_serving(
    tmp_path: Path,
) -> None:
    rego_bundle(tmp_path, GOOD)
    store = PolicyStore([tmp_path])
    assert store.reload(check=check_bundle).errors == ()
    before = store.snapshot
    rego_bundle(tmp_path, BROKEN, version="1.1.0")
    snap = store.reload(check=check_bundle)
    assert len(snap.errors) == 1
    assert "policy.rego:3:" in snap.errors[0].message
    assert snap.active == {"b": "1.0.0"}
    result = (await store.evaluate("t", INPUT)).result
    assert (result.effect, result.reasons[0].code) == ("allow", "v1")
    # a request that started on the old snapshot finishes on it
    assert (await store.evaluate("t", INPUT, snapshot=before)).policy == snap.active_bundle(
        "b"
    ).ref()


async def test_a_fixed_bundle_loads_on_the_next_reload(tmp_path: Path) -> None:
    rego_bundle(tmp_path, GOOD)
    store = PolicyStore([tmp_path])
    store.reload(check=check_bundle)
    folder = rego_bundle(tmp_path, BROKEN, version="2.0.0")
    store.reload(check=check_bundle)
    (folder / "policy.rego").write_text(GOOD_V2)
    snap = store.reload(check=check_bundle)
    assert snap.errors == ()
    # the previously active version stays active while it is still loaded; here the
    # folder now holds only 2.0.0, so 2.0.0 becomes active
    assert snap.active == {"b": "2.0.0"}
    assert (await store.evaluate("t", INPUT)).result.effect == "deny"


async def test_a_rego_bundle_failing_its_own_cases_is_refused(tmp_path: Path) -> None:
    rego_bundle(tmp_path, GOOD)
    store = PolicyStore([tmp_path])
    store.reload(check=check_bundle)
    rego_bundle(
        tmp_path,
        GOOD_V2,
        version="1.1.0",
        extra='cases = "cases.yaml"\n',
        files={"cases.yaml": "- {input: {tool: {name: get_order}}, want: {effect: allow}}\n"},
    )
    snap = store.reload(check=check_bundle)
    assert "failing" in snap.errors[0].message
    assert snap.active == {"b": "1.0.0"}


async def test_a_rego_bundle_failing_its_test_rules_is_refused(tmp_path: Path) -> None:
    rego_bundle(
        tmp_path,
        GOOD,
        files={
            "policy_test.rego": (
                "package cosigner.test_test\n\nimport data.cosigner.test\n\n"
                'test_denies if test.decision.effect == "deny"\n'
            )
        },
    )
    snap = PolicyStore([tmp_path]).reload(check=check_bundle)
    assert "test_denies" in snap.errors[0].message
    assert snap.active == {}


async def test_K01_no_bundle_loaded_denies_policy_not_loaded(tmp_path: Path) -> None:
    store = PolicyStore([tmp_path])
    store.reload(check=check_bundle)
    assert not store.ready
    result = (await store.evaluate("t", INPUT)).result
    assert (result.effect, result.reasons[0].code) == ("deny", "policy_not_loaded")


async def test_tenants_are_routed_to_the_rego_or_python_refund_bundle(tmp_path: Path) -> None:
    shutil.copytree(REFUNDS_PY, tmp_path / "policies" / "refunds")
    shutil.copytree(REFUNDS_REGO, tmp_path / "rego" / "refunds")
    store = PolicyStore([tmp_path / "policies", tmp_path / "rego"])
    snap = store.reload(check=check_bundle)
    assert snap.errors == ()
    assert snap.bundle_for("rego-demo").id == "refunds-rego"  # type: ignore[union-attr]
    assert snap.bundle_for("acme").id == "refunds"  # type: ignore[union-attr]
    assert snap.bundle_for("rego-demo").catalogue is not None  # type: ignore[union-attr]
    switched = PolicyStore(
        [tmp_path / "policies", tmp_path / "rego"], tenant_bundles={"acme": "refunds-rego"}
    )
    assert switched.reload().bundle_for("acme").id == "refunds-rego"  # type: ignore[union-attr]


def test_engine_factory_passes_the_opa_settings(tmp_path: Path) -> None:
    folder = write_bundle(tmp_path, "o", {"manifest.toml": manifest(id="o", engine="opa")})
    store = PolicyStore(
        [tmp_path], engine_factory=engine_factory(opa_url="http://127.0.0.1:9", opa_timeout_ms=250)
    )
    engine = store.load_bundle(folder).engine
    assert isinstance(engine, OpaEngine)
    assert (engine.url, engine.timeout_s, engine.path) == (
        "http://127.0.0.1:9",
        0.25,
        "cosigner/test/decision",
    )


def test_bundle_for_is_remembered_per_snapshot_and_follows_a_new_one(tmp_path: Path) -> None:
    rego_bundle(tmp_path, GOOD)
    rego_bundle(tmp_path / "v2", GOOD_V2, version="2.0.0")
    store = PolicyStore([tmp_path, tmp_path / "v2"])
    first = store.reload(check=check_bundle)
    chosen = first.bundle_for("acme")
    assert chosen is not None and first.bundle_for("acme") is chosen
    assert first.bundle_for("acme") is first.active_bundle(first.route("acme") or "")
    other = "1.0.0" if chosen.version == "2.0.0" else "2.0.0"
    store.set_active("b", other)  # a new snapshot: routed afresh
    assert store.snapshot.bundle_for("acme").version == other  # type: ignore[union-attr]
    assert first.bundle_for("acme") is chosen  # the old snapshot keeps its answer
