"""Fetches the pinned third-party front-end assets from the npm registry into web/static/vendor/, checking
each file's sha256; nothing third-party is committed and nothing is fetched at run time."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from web.static import VENDOR_DIR


@dataclass(frozen=True, slots=True)
class Asset:
    package: str
    version: str
    member: str  # path inside the npm tarball
    target: str  # file name under vendor/
    sha256: str


ASSETS = (
    Asset(
        "htmx.org",
        "2.0.11",
        "package/dist/htmx.min.js",
        "htmx.min.js",
        "d6fdc75f204e6bdefa99b69bf1e6d4ac69b8a364f77929f45c13476b4000f717",
    ),
    # The chat's Markdown: markdown-it parses (raw HTML off), DOMPurify sanitizes what it wrote, highlight.js
    # colours code. Their ES-module browser builds, so the chat's modules import them without globals.
    Asset(
        "markdown-it",
        "15.0.3",
        "package/dist/browser/markdown-it.esm.min.mjs",
        "markdown-it.min.js",
        "d5432491790141da046b1197353705db03264f40b5727f3b4b591f5aba193e30",
    ),
    Asset(
        "dompurify",
        "3.5.0",
        "package/dist/purify.es.mjs",
        "purify.js",
        "5e8c53cd086a012531fc754ee6a7ad7a02e8a06fc4dadd805b912e128c3f6c58",
    ),
    Asset(
        "@highlightjs/cdn-assets",
        "11.12.0",
        "package/es/highlight.min.js",
        "highlight.min.js",
        "1ed8fc5256b738b8875b74e4d3f0754f60d6411fb034d618dfbc4e6e6c9999d7",
    ),
    Asset(
        "@highlightjs/cdn-assets",
        "11.12.0",
        "package/styles/github.min.css",
        "highlight-github.min.css",
        "3a9a5def8b9c311e5ae43abde85c63133185eed4f0d9f67fea4b00a8308cf066",
    ),
)


class AssetError(RuntimeError):
    """An asset could not be fetched, or its content is not the pinned one."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _npm_pack(asset: Asset, workdir: Path) -> Path:
    npm = shutil.which("npm")
    if npm is None:
        raise AssetError("npm is needed to fetch the front-end assets (apt-get install npm)")
    spec = f"{asset.package}@{asset.version}"
    done = subprocess.run(
        [npm, "pack", spec, "--silent", "--pack-destination", str(workdir)],
        cwd=workdir,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise AssetError(f"npm pack {spec} failed: {done.stderr.strip() or done.stdout.strip()}")
    tarballs = list(workdir.glob("*.tgz"))
    if len(tarballs) != 1:
        raise AssetError(f"npm pack {spec} left {len(tarballs)} tarballs, expected one")
    return tarballs[0]


def _extract(tarball: Path, member: str) -> bytes:
    with tarfile.open(tarball, "r:gz") as archive:
        try:
            handle = archive.extractfile(member)
        except KeyError:
            handle = None
        if handle is None:
            raise AssetError(f"{tarball.name} has no file {member}")
        return handle.read()


def is_current(asset: Asset, dest: Path) -> bool:
    path = dest / asset.target
    return path.is_file() and _sha256(path.read_bytes()) == asset.sha256


def fetch_asset(asset: Asset, dest: Path) -> Path:
    """Fetch one asset (skipped when the file on disk already has the pinned hash); refuse a mismatch."""
    path = dest / asset.target
    if is_current(asset, dest):
        return path
    with tempfile.TemporaryDirectory(prefix="appliance-assets-") as tmp:
        data = _extract(_npm_pack(asset, Path(tmp)), asset.member)
    actual = _sha256(data)
    if actual != asset.sha256:
        raise AssetError(
            f"{asset.package}@{asset.version} {asset.member}: sha256 {actual} is not the pinned {asset.sha256}; "
            "refusing to install it"
        )
    dest.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(path.suffix + ".part")
    partial.write_bytes(data)
    partial.replace(path)  # atomic: a cut download never leaves a half file under the served name
    return path


def fetch_assets(dest: Path = VENDOR_DIR) -> list[Path]:
    return [fetch_asset(asset, dest) for asset in ASSETS]


def main() -> None:
    try:
        for path in fetch_assets(VENDOR_DIR):
            print(f"ok {path}")
    except AssetError as exc:
        sys.exit(f"assets: {exc}")


if __name__ == "__main__":
    main()
