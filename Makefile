# The two commands of the README: `make demo` (the main job) and `make test` (every check).
# Both create .venv from requirements.lock on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv demo replay test lint tools lock clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c requirements.lock -e '.[dev]'
	touch $@

demo: venv
	$(BIN)/autoscalerd demo

replay: venv
	$(BIN)/autoscalerd run --dry-run --config config/replay.yaml

lint: venv
	$(BIN)/ruff check autoscalerd plugins tests benchmarks
	$(BIN)/ruff format --check autoscalerd plugins tests benchmarks
	$(BIN)/mypy

# promtool, which the alert and dashboard tests run: Debian's prometheus package, when
# promtool is not on PATH. The tests need only promtool: where systemd started the
# package's server (on :9090), it is stopped and disabled again.
tools:
	@command -v promtool >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" -ne 0 ]; then \
	    echo "make tools: promtool is not on PATH; run sudo make tools (installs the Debian package prometheus) or put promtool on PATH" >&2; \
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

lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install --quiet -e '.[dev]'
	( echo '# Pinned versions of every package autoscalerd and its tests install (pip constraints).'; \
	  echo '# Regenerate: make lock'; \
	  .lock-venv/bin/pip freeze --exclude-editable ) > requirements.lock
	rm -rf .lock-venv

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
