"""Node packages the tests run, installed as a user would: `npm ci` from a folder's pinned package-lock.json (every
package's integrity hash checked; --ignore-scripts: nothing from the registry runs at install), once per lock file,
into the test cache outside the clone (kept between runs)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest


def npm_installed(folder: Path, cache_name: str) -> Path:
    """The install root (its node_modules/ holds the packages) of `folder`'s package.json and package-lock.json."""
    if shutil.which("npm") is None:
        pytest.fail("npm is needed for these tests (make sysdeps-test installs it)")
    digest = hashlib.sha256((folder / "package-lock.json").read_bytes()).hexdigest()[:16]
    root = Path(os.environ["LLM_APPLIANCE_TEST_CACHE"]) / cache_name / digest
    stamp = root / ".installed"
    if not stamp.exists():
        root.mkdir(parents=True, exist_ok=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copy(folder / name, root / name)
        subprocess.run(
            ["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=root, check=True, timeout=600,
        )  # fmt: skip
        stamp.touch()
    return root
