# The two commands of the README: `make demo` (the main job) and `make test` (every check).
# Both create .venv from requirements-dev.lock on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip --disable-pip-version-check

.PHONY: venv demo replay test lint tools lock clean

venv: $(VENV)/.installed

# Every package at the lock's version and hash (the daemon's, the backtest's and the
# demo's, the tools'), then autoscalerd itself, editable, with nothing more.
$(VENV)/.installed: pyproject.toml requirements-dev.lock
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --require-hashes --requirement requirements-dev.lock
	$(PIP) install --quiet --no-deps --editable .
	touch $@

demo: venv
	$(BIN)/autoscalerd demo

replay: venv
	$(BIN)/autoscalerd run --dry-run --config config/replay.yaml

lint: venv
	$(BIN)/ruff check autoscalerd plugins tests benchmarks
	$(BIN)/ruff format --check autoscalerd plugins tests benchmarks
	$(BIN)/mypy

# promtool, which the alert and dashboard tests run, and the Prometheus server, which
# tests/prom starts on a free loopback port of its own: Debian's prometheus package, when
# either is not on PATH. Where systemd started the package's server (on :9090), it is
# stopped and disabled again.
tools:
	@{ command -v promtool && command -v prometheus; } >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" -ne 0 ]; then \
	    echo "make tools: promtool or prometheus is not on PATH; run sudo make tools (installs the Debian package prometheus) or put both on PATH" >&2; \
	    exit 1; \
	  fi; \
	  apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus && \
	  if [ -d /run/systemd/system ] && systemctl is-active --quiet prometheus; then \
	    systemctl disable --now --quiet prometheus; \
	  fi; \
	}

test: lint tools
	$(BIN)/pytest

# The locks, each file's hash included, resolved for every Python autoscalerd supports
# (>= 3.10) and every platform: requirements.lock is the daemon's dependencies alone (the
# image, a service), requirements-ray.lock adds the ray extra, requirements-dev.lock is
# what `make venv` installs (every extra and the tools). The versions in the locks are
# kept where they still fit; `make lock LOCK_FLAGS=--upgrade` takes the newest.
UV_VERSION := 0.13.9
LOCK_FLAGS ?=
UV_COMPILE := .lock-venv/bin/uv pip compile pyproject.toml --universal --python-version 3.10 \
	--generate-hashes --quiet --custom-compile-command 'make lock' $(LOCK_FLAGS)

lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	$(UV_COMPILE) --output-file requirements.lock
	$(UV_COMPILE) --extra ray --output-file requirements-ray.lock
	$(UV_COMPILE) --extra dev --output-file requirements-dev.lock
	rm -rf .lock-venv

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
