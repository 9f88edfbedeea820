# The one task runner for contributors and CI (.ci/run calls the same commands).
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint bench
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV) && $(VENV)/bin/pip install -q -e '.[dev]' && touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/saga demo

test: $(VENV)/.installed
	$(PY) -m pytest

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy
	$(VENV)/bin/check-jsonschema --builtin-schema vendor.compose-spec compose.yaml

bench: $(VENV)/.installed
	$(PY) bench/bus_throughput.py
