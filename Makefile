# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SYSSTAMP := $(VENV)/.system-deps

.PHONY: run test bench lint install system-deps clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test]"
	touch $@

# Debian packages the tests drive (kcat, Java for Spark); skipped when already present.
$(SYSSTAMP): scripts/install-system-deps.sh | $(STAMP)
	scripts/install-system-deps.sh
	touch $@

install: $(STAMP)

system-deps: $(SYSSTAMP)

run: $(STAMP)
	$(BIN)/kafscale serve --listen 127.0.0.1:9092 --data-dir ./data

test: $(STAMP) $(SYSSTAMP)
	$(BIN)/ruff check kafscale tests benchmarks
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP) $(SYSSTAMP)
	$(BIN)/pip install --quiet -e ".[test,bench]"
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check kafscale tests benchmarks
	$(BIN)/ruff format --check kafscale tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
