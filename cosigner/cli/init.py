"""``cosigner init DIR``: write a starter policy bundle (catalogue, rules, golden cases).

The files ship inside the package (``cosigner/cli/starter``), so a ``pip install``ed
Cosigner can make a bundle that passes ``cosigner policy test DIR`` and that ``cosigner
serve`` loads with ``COSIGNER_BUNDLE_DIRS='["DIR"]'``.
"""

from __future__ import annotations

import argparse
import sys
from importlib.resources import files
from pathlib import Path

from cosigner.core.settings import Settings

STARTER_FILES = ("manifest.toml", "tools.yaml", "rules.py", "cases.yaml")


def init_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path, metavar="DIR",
                   help="folder of bundles to create; the bundle goes to DIR/starter")
    p.add_argument("--force", action="store_true",
                   help="overwrite the starter files if DIR/starter exists")


def init_cmd(args: argparse.Namespace, _: Settings) -> int:
    target = args.dir / "starter"
    if target.exists() and not args.force:
        print(f"error: {target} exists (use --force to overwrite)", file=sys.stderr)
        return 1
    target.mkdir(parents=True, exist_ok=True)
    source = files("cosigner.cli").joinpath("starter")
    for name in STARTER_FILES:
        (target / name).write_text(source.joinpath(name).read_text(encoding="utf-8"),
                                   encoding="utf-8")
    folder = args.dir.resolve()
    print(f"wrote {target}/ ({', '.join(STARTER_FILES)})\n"
          f"test it:  cosigner policy test {args.dir}\n"
          f"serve it: COSIGNER_BUNDLE_DIRS='[\"{folder}\"]' cosigner serve", file=sys.stderr)
    return 0
