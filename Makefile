# Everything a fresh machine needs: `make demo` and `make test` create .venv on first use.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch/torchvision are pinned to the builds on the CPU machines' local disk; pip resolves
# everything else from PyPI within the ranges in pyproject.toml.
TORCH_PIN ?= torch==2.14.1 torchvision==0.29.1
STAMP := $(VENV)/.installed

.PHONY: setup demo test slow_test quality bench clean

$(STAMP): pyproject.toml
	@command -v fc-list >/dev/null && fc-list | grep -qi "DejaVu Sans" && fc-list | grep -qi "Dancing Script" && \
	  fc-list | grep -qi "Nimbus Sans" || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fonts-dejavu-core fonts-dancingscript fonts-urw-base35 fontconfig >/dev/null) || \
	  echo "warning: could not install the fonts; rendered text and CrossMath puzzles fall back to other fonts"
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH_PIN)
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m tokenswap.demo --out demo_out

test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not gpu" -q

slow_test: $(STAMP)
	$(BIN)/python -m pytest -m "slow" -q

quality: $(STAMP)
	$(BIN)/ruff check tokenswap recipes tests benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/collator_throughput.py

clean:
	rm -rf $(VENV) demo_out outputs
