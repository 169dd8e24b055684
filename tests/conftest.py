"""Test-wide set-up: one model cache for the whole run, so the bundled model is converted once."""

from __future__ import annotations

import os
from pathlib import Path

# Must happen before engine modules read it.
os.environ.setdefault("APPLIANCE_DATA_DIR", str(Path(__file__).resolve().parent.parent / "data" / "test-cache"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
