"""openapi.yaml is generated from the app; regenerate with `make openapi`."""

from pathlib import Path

import yaml

from cosigner.app import create_app

ROOT = Path(__file__).resolve().parents[2]


def test_openapi_yaml_matches_the_app() -> None:
    on_disk = yaml.safe_load((ROOT / "openapi.yaml").read_text())
    assert on_disk == create_app().openapi(), "openapi.yaml drifted: run `make openapi`"
