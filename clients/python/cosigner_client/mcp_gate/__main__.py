"""``python -m cosigner_client.mcp_gate`` = ``cosigner-mcp-gate``."""

import sys

from cosigner_client.mcp_gate.cli import main

sys.exit(main())
