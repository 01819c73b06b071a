"""Put on PYTHONPATH by tests/conftest.py while an overlay upstream's tree is under test: processes started
by the tests (vLLM's engine and workers) import the same redirected modules (tools.patches.overlay_import)."""

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[3]))  # the checkout, for `tools`

from tools.patches import overlay_import  # noqa: E402

overlay_import.install_from_env()
