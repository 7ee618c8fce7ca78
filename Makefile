# Two commands set everything up on a fresh Debian machine with python3: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TRACES ?= $(firstword $(TELLER_TRACES) $(wildcard ../shared/traces) .traces)
DEMO_TRACE ?= $(TRACES)/tracelens/vllm_prefilldecode_piecewise/graph_execution.json.gz

.PHONY: all venv demo test lint format traces bench clean

all: test

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || { \
	  echo "python3 -m venv failed; installing Debian's python3-venv" >&2; \
	  apt-get update -q && apt-get install -y -q python3-venv python3-pip && $(PYTHON) -m venv $(VENV); }

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev,lab]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/teller info $(DEMO_TRACE)
	$(BIN)/teller tree $(DEMO_TRACE) --step 0 --depth 3

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/ruff format --check src tests bench scripts

format: $(STAMP)
	$(BIN)/ruff format src tests bench scripts
	$(BIN)/ruff check --fix src tests bench scripts

traces:
	@if [ -d ../shared/traces ]; then echo "real traces present in ../shared/traces"; \
	else $(PYTHON) scripts/fetch_traces.py .traces; fi

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
