"""``python -m cosigner``: the same command line as the ``cosigner`` script."""

import sys

from cosigner.cli.main import main

sys.exit(main())
