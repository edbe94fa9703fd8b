"""Print openapi.yaml generated from create_app().openapi() (`make openapi`)."""

import sys

import yaml

from cosigner.app import create_app

yaml.safe_dump(create_app().openapi(), sys.stdout, sort_keys=False, allow_unicode=True)
