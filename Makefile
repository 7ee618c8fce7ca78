# Two commands set everything up on a fresh Debian machine with python3: `make demo` and `make test`.
# `make test-fast` is the edit loop: the suite without the lab, train, browser and slow tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TRACES ?= $(firstword $(TELLER_TRACES) $(wildcard ../shared/traces) .traces)
DEMO_OUT ?= demo-out

.PHONY: all venv demo test test-fast lint format traces bench clean system-tools model

all: test

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || { \
	  echo "python3 -m venv failed; installing Debian's python3-venv" >&2; \
	  apt-get update -q && apt-get install -y -q python3-venv python3-pip && $(PYTHON) -m venv $(VENV); }

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev,model,lab,eval,ray]'
	touch $(STAMP)

venv: $(STAMP)

# A real end-to-end diagnosis: serve a small Llama over 2 tensor-parallel ranks under a real
# straggler (rank 1 throttled), record it with the non-intrusive collector, analyse it.
demo: $(STAMP) system-tools
	rm -rf $(DEMO_OUT)/case && mkdir -p $(DEMO_OUT)
	@echo "recording a real 2-rank case under a straggler fault (about a minute)..."
	$(BIN)/teller -q lab run --fault straggler --rank 1 --intensity 0.7 --window 4:9 \
	  --tp 2 --duration 12 --rate 4 --seed 7 --out $(DEMO_OUT)/case > $(DEMO_OUT)/lab.log 2>&1 \
	  || { tail -20 $(DEMO_OUT)/lab.log; exit 1; }
	$(BIN)/teller -q analyze $(DEMO_OUT)/case -o $(DEMO_OUT)/report.html \
	  --perfetto $(DEMO_OUT)/annotated.trace.json.gz

# Debian tools the tests drive: headless Chromium (HTML report), iproute2 and taskset (the lab).
SYSTEM_TOOLS := chromium:chromium ip:iproute2 tc:iproute2 taskset:util-linux

system-tools:
	@missing=""; for pair in $(SYSTEM_TOOLS); do tool=$${pair%%:*}; pkg=$${pair##*:}; \
	  command -v $$tool >/dev/null 2>&1 || missing="$$missing $$pkg"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q $$missing \
	    || echo "could not install$$missing: the tests that need them will skip" >&2; \
	  else echo "not root: install$$missing for the browser and lab tests" >&2; fi; fi

test: $(STAMP) system-tools
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/python -m pytest -q

# The markers are declared in pyproject.toml; what they leave out needs no system tools.
FAST_TESTS := not lab and not train and not browser and not slow

test-fast: $(STAMP)
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/python -m pytest -q -m "$(FAST_TESTS)"

lint: $(STAMP)
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/ruff format --check src tests bench scripts

format: $(STAMP)
	$(BIN)/ruff format src tests bench scripts
	$(BIN)/ruff check --fix src tests bench scripts

# Rebuild the default root-cause model from its committed recipes: the training cases (simulated,
# and real lab runs, which need root), then the three-member ensemble (src/teller/rca/default_model).
MODEL_DATA ?= /tmp/teller-model-data
MODEL_RECIPES := sim-train-v1 sim-train-v2 lab-train-v1 lab-train-v2 sim-train-v3
# The step threshold is chosen on cases neither trained on nor on the scoreboard.
CALIBRATION_RECIPES := sim-eval-v6 lab-val-v1

model: $(STAMP) system-tools
	for recipe in $(MODEL_RECIPES) $(CALIBRATION_RECIPES); do \
	  $(BIN)/teller -q lab recipe evalsets/$$recipe.json --out $(MODEL_DATA)/$$recipe || exit 1; done
	$(BIN)/teller train --data $(addprefix $(MODEL_DATA)/,$(MODEL_RECIPES)) \
	  -o src/teller/rca/default_model/model --jobs 3 --members 3 --epochs 20 --cache $(MODEL_DATA)/cache
	$(BIN)/teller -q calibrate --cases $(addprefix $(MODEL_DATA)/,$(CALIBRATION_RECIPES)) \
	  --model src/teller/rca/default_model/model

traces:
	@if [ -d ../shared/traces ]; then echo "real traces present in ../shared/traces"; \
	else $(PYTHON) scripts/fetch_traces.py .traces; fi

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
