# The one task runner for contributors and CI (.ci/run calls the same commands).
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-lowest lint bench budget
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV) && $(VENV)/bin/pip install -q -e '.[dev]' && touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/saga demo

test: $(VENV)/.installed
	$(PY) -m pytest

# The suite on the lowest versions the declared runtime ranges allow (as CI runs it).
test-lowest:
	python3 -m venv .venv-lowest && .venv-lowest/bin/pip install -q uv
	python3 .ci/lowest.py > .venv-lowest/runtime.in
	.venv-lowest/bin/uv pip compile -q --resolution lowest-direct --python .venv-lowest/bin/python \
		.venv-lowest/runtime.in -o .venv-lowest/lowest.txt
	.venv-lowest/bin/pip install -q -c .venv-lowest/lowest.txt -e '.[dev]'
	.venv-lowest/bin/python -m pytest

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy
	$(VENV)/bin/check-jsonschema --builtin-schema vendor.compose-spec compose.yaml

bench: $(VENV)/.installed
	$(PY) bench/bus_throughput.py

# Client instructions per signed saga (burst and one at a time) under valgrind against the
# budget in bench/budget.json; fails when either is over it (as CI runs it, ~2-3 minutes).
budget: $(VENV)/.installed
	$(PY) bench/budget.py
