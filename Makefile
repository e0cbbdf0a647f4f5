# The two commands README starts with: `make demo` and `make test`. Both set up everything they need.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo tensorboard-screenshot test lint synth clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python requirements.txt requirements-train.txt requirements-dev.txt pyproject.toml
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

setup: $(VENV)/.installed node_modules/.installed

demo: setup
	$(BIN)/python -m tools.demo

# docs/tensorboard.png, README's view of the demo's TensorBoard (needs Debian's chromium; after `make demo`).
tensorboard-screenshot: setup
	$(BIN)/python -m tools.tensorboard_screenshot

# The whole suite on the pinned torch, then the training package's tests again on every torch version
# in the tested set (platform_config/tested_torch.json; a venv each, made once). The config loader refuses a
# cdk.json pytorch_versions entry outside that set, so every framework image the platform offers is tested here.
# --durations: each phase ends with its slowest tests (where the 15 minutes go).
# Bytecode (and pytest's rewritten test modules) cached in __pycache__, which git ignores and the source bundle skips:
# with PYTHONDONTWRITEBYTECODE set, as on the CI machines, every one of the suite's hundreds of processes compiles the
# package again, and each worker rewrites every test module's asserts (7 s of a 16 s collection, measured here).
test: export PYTHONDONTWRITEBYTECODE =
test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=15
	$(BIN)/python -m tools.image_torch -- -n 2 --dist loadfile --no-loadscope-reorder --durations=15

synth: setup
	PATH="$(CURDIR)/$(BIN):$(CURDIR)/node_modules/.bin:$$PATH" cdk synth --quiet
	$(BIN)/python -m tools.deploy_summary cdk.out

clean:
	rm -rf $(VENV) .venv-torch-* node_modules cdk.out .demo
