# Two set-up commands on a fresh machine (python3 + network to the package index):
#   make demo   install the fork into .venv, serve a tiny Gemma-4 on CPU, talk to it (OpenAI API)
#   make test   install the fork into .venv, check every step of the stacks, run the CPU suite
# BASE picks the upstream release (default 0.5.17; `make test BASE=0.5.23` builds the stacks
# ported to 0.5.23 in bases/0.5.23/, in .venv-0.5.23 with that release's dependencies).
PY ?= python3
DEFAULT_BASE := 0.5.17
BASE ?= $(DEFAULT_BASE)
ifeq ($(BASE),$(DEFAULT_BASE))
VENV := .venv
REQS := requirements-cpu.txt
# The fork tool's and the benchmarks' tests do not depend on the base: they run here.
SUITE := test/srt test/bench test/tools
PHASE :=
else
VENV := .venv-$(BASE)
# A base's requirements-cpu.txt holds only the pins that differ: the whole list is built.
REQS := build/requirements-$(BASE).txt
SUITE := test/srt
empty :=
PHASE := $(empty) ($(BASE))
endif
VPY := $(VENV)/bin/python
FORK := $(PY) tools/fork.py --base $(BASE)
# Test processes at once: the per-step check's worktrees and the suite's pytest-xdist
# workers. A test mostly keeps one core busy, so the default is the CI machine's 2 cores.
JOBS ?= 2
# One intra-op thread per process: the tests' tiny models gain nothing from more, and
# with JOBS test processes and their engines' schedulers on as many cores, each torch's
# OpenMP threads spun against the others' (an engine test used about 30 % more CPU).
export OMP_NUM_THREADS ?= 1

.PHONY: demo test install check export clean lint

build/requirements-$(BASE).txt: requirements-cpu.txt bases/$(BASE)/requirements-cpu.txt
	$(FORK) requirements $@

$(VENV)/.deps: $(REQS)
	@$(PY) tools/check_env.py $(VENV)
	@echo "[phase] dependencies$(PHASE): creating $(VENV) (takes minutes on a fresh machine)"
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --no-cache-dir --upgrade pip || { echo "error: pip could not reach the package index (check network/proxy)"; exit 1; }
	$(VPY) -m pip install -q --no-cache-dir -r $(REQS) || { echo "error: installing $(REQS) failed (see pip's message above; is the package index reachable?)"; exit 1; }
	touch $@

install: $(VENV)/.deps
	@$(PY) tools/phase.py "install$(PHASE)" $(FORK) install --venv $(VENV) --no-deps-check

# Every step of patches/series applies, imports and passes its own tests (and its proofs
# fail one step earlier); then the whole suite runs against the installed fork, which is
# the last step's tree. For CI time each test runs once: the stacks' own tests (engine and
# server runs) and the last step's run in the suite only, not also at their stack's end
# (`fork.py check --each` without the two options runs them there too).
test: install lint
	@$(PY) tools/phase.py "per-step-check$(PHASE)" $(FORK) check --each --last-stack-in-suite --stack-tests-in-suite --jobs $(JOBS) --python $(VPY)
	@$(PY) tools/phase.py "suite$(PHASE)" $(VPY) -m pytest $(SUITE) -q -n $(JOBS) --dist loadfile --no-loadscope-reorder --durations=15

# pyproject.toml's [tool.ruff]: syntax errors, undefined and unused names.
lint: $(VENV)/.deps
	@$(PY) tools/phase.py "lint$(PHASE)" $(VPY) -m ruff check --quiet .

demo: install
	$(VPY) scripts/demo.py

check:
	$(FORK) check

export:
	$(FORK) export build/export$(if $(PHASE),-$(BASE)) --force

clean:
	rm -rf build .venv .venv-*
