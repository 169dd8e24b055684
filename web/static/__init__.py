"""The browser pages' static files: our own JS and CSS, and vendor/ (third-party assets fetched by assets.py)."""

from pathlib import Path

STATIC_DIR = Path(__file__).parent
VENDOR_DIR = STATIC_DIR / "vendor"
