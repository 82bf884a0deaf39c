# Everything a fresh machine needs: `make demo` and `make test` create .venv on first use.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# constraints.txt: the exact versions the tests run against (torch/torchvision: the builds on the CPU machines'
# local disk); pyproject.toml holds the ranges the library accepts.
CONSTRAINTS ?= constraints.txt
STAMP := $(VENV)/.installed
# torch and torchvision: PyPI has only CUDA builds for x86-64 Linux, which pull 18 nvidia-* wheels and triton (a
# 6.7 GB .venv). Without CUDA (no nvidia-smi) the Makefile installs the same versions' CPU builds from PyTorch's CPU
# index instead; `make setup CUDA=1` (or a machine with nvidia-smi) installs PyPI's CUDA build. Where the CPU index
# cannot be reached it says so and installs PyPI's build (docs/versions.md).
CUDA ?= $(if $(shell command -v nvidia-smi 2>/dev/null),1,0)
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_PINS := $(shell grep -E '^(torch|torchvision)==' $(CONSTRAINTS))

# PYTEST_ARGS: more pytest options, e.g. `make test PYTEST_ARGS=--durations=25` (.ci/run prints the 25 slowest).
PYTEST_ARGS ?=

.PHONY: setup demo test check slow_test quality bench clean
.PHONY: compat compat_test

$(STAMP): pyproject.toml $(CONSTRAINTS)
	@command -v fc-list >/dev/null && fc-list | grep -qi "DejaVu Sans" && fc-list | grep -qi "Dancing Script" && \
	  fc-list | grep -qi "Nimbus Sans" || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fonts-dejavu-core fonts-dancingscript fonts-urw-base35 fontconfig >/dev/null) || \
	  echo "warning: could not install the fonts; rendered text and CrossMath puzzles fall back to other fonts"
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
ifeq ($(CUDA),1)
	$(BIN)/pip install -q -c $(CONSTRAINTS) torch torchvision
else
	@$(BIN)/python -c "import urllib.request; urllib.request.urlopen('$(TORCH_CPU_INDEX)/torch/', timeout=15)" \
	  2>/dev/null || echo "make: PyTorch's CPU index $(TORCH_CPU_INDEX) is unreachable: pip's errors below come from that"
	$(BIN)/pip install -q -c $(CONSTRAINTS) --extra-index-url $(TORCH_CPU_INDEX) $(addsuffix +cpu,$(TORCH_PINS)) || \
	  { echo "warning: no CPU build of $(TORCH_PINS) from $(TORCH_CPU_INDEX) (unreachable?); installing PyPI's" \
	    "CUDA build with its nvidia-* wheels (a 6.7 GB .venv). Set TORCH_CPU_INDEX=<a mirror> to retry."; \
	    $(BIN)/pip install -q -c $(CONSTRAINTS) torch torchvision; }
endif
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e ".[all,dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py --out demo_out

# The whole suite: what CI and the README run (docs/contributing.md gives its duration).
test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not gpu" -q $(PYTEST_ARGS)

# The fast loop: no test that starts a process, a server or a training run (tests/test_markers.py keeps them marked).
check: $(STAMP)
	$(BIN)/python -m pytest -m "not integration and not slow and not gpu" -q $(PYTEST_ARGS)

slow_test: $(STAMP)
	$(BIN)/python -m pytest -m "slow" -q

quality: $(STAMP)
	$(BIN)/ruff check tokenswap recipes tests benchmarks examples
	$(BIN)/lint-imports  # the import floors of docs/architecture.md (also run by tests/test_architecture.py)

# The compatibility subset (`compat` marker); compat_test runs it on the floor: constraints-lowest.txt in .venv-lowest.
compat: $(STAMP)
	$(BIN)/python -m pytest -m "compat and not gpu" -q

compat_test:
	$(MAKE) compat VENV=.venv-lowest CONSTRAINTS=constraints-lowest.txt

bench: $(STAMP)
	$(BIN)/python benchmarks/collator_throughput.py

clean:
	rm -rf $(VENV) demo_out outputs
