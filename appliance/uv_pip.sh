#!/bin/sh
# Installs packages into a venv with uv, from where pip there would take them:
#   appliance/uv_pip.sh UV VENV_PYTHON ARGS...   (ARGS: those of `uv pip install`)
# uv reads no pip configuration, so the venv's pip is asked for its own (`pip config list`; as in pip, the
# environment's PIP_* wins over a file's [install] section, which wins over its [global] one): index-url,
# extra-index-url, find-links (where a CPU build of torch may lie on disk), constraint and cert; indexes are
# searched as pip searches them (the best version anywhere: unsafe-best-match). Used by `make setup` and `make
# vllm-env`: a fresh clone's two venvs took 44 s in all with uv (its own install included) against 74 s and 103 s
# with pip on the 2-core box, most of pip's time its compiling every module it installs (uv compiles none; the
# tests then compile what they import, once). install.sh keeps pip: an operator's pip settings are all pip's.
set -eu

[ $# -ge 3 ] || {
    echo "usage: $0 UV VENV_PYTHON ARGS..." >&2
    exit 2
}
uv=$1
python=$2
shift 2
settings=$("$python" - <<'EOF'
import os
import shlex
import subprocess
import sys

listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
RANK = {"global": 1, "install": 2, ":env:": 3}
found: dict[str, tuple[int, str]] = {}
for line in listed.splitlines():
    name, _, value = line.partition("=")
    scope, _, key = name.rpartition(".")
    value = value.strip().strip("'\"")
    if value and RANK.get(scope, 0) > found.get(key, (0, ""))[0]:
        found[key] = (RANK[scope], value)
flags = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraint"}
words = [w for key, flag in flags.items() if key in found for value in found[key][1].split() for w in (flag, value)]
cert = "" if os.environ.get("SSL_CERT_FILE") else found.get("cert", (0, ""))[1]
print(("export SSL_CERT_FILE=" + shlex.quote(cert) + "; " if cert else "") + "set -- " + shlex.join(words))
EOF
)
eval "$settings"' "$@"'
exec "$uv" pip install --quiet --python "$python" --index-strategy unsafe-best-match "$@"
