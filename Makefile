# Quickstart: `make demo` trains the demo job, `make test` runs the CPU suite but its slow tests,
# `make test-all` every test (CI runs `make test`). Each target builds .venv first (torch pinned to
# 2.13.0: see constraints.txt).
VENV ?= .venv
PY := $(VENV)/bin/python
# loadgroup: tests marked heavy share one worker (conftest.py), so no two run at once.
PYTEST_ARGS ?= -n 2 --dist loadgroup

.PHONY: demo test test-all multiproc gpu lint bench stress scale mutation compat clean

# The demo needs refddp itself; the tests also every optional extra they exercise.
$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0 numpy
	$(PY) -m pip install -q -c constraints.txt -e '.[plot]'
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PY) -m pip install -q -c constraints.txt -e '.[test,plot,lint,examples,export,tensorboard,wandb]'
	touch $@

demo: $(VENV)/.installed
	$(PY) -m refddp.train --nproc 2 --out runs/demo

test: $(VENV)/.installed-test
	$(PY) -m pytest $(PYTEST_ARGS) -m "not slow"

# Everything, the slow tests too (whole CLI jobs, restarts, real nodes, SLURM where installed,
# compile) and the trainer at 256 ranks (tests/training/test_scale.py).
test-all: $(VENV)/.installed-test
	REFDDP_LARGE_WORLDS=1 $(PY) -m pytest $(PYTEST_ARGS)

multiproc: $(VENV)/.installed-test
	$(PY) -m pytest -m multiproc

gpu: $(VENV)/.installed-test
	$(PY) -m pytest -m gpu tests/gpu

# Flake hunt (issue 15): the fault and CLI end-to-end tests, STRESS_REPETITIONS pytest sessions
# under -n 2; runs and failures per test go to benchmarks/results/stress.json. Then the
# generated step scenarios (tests/training/test_step_scenarios.py), STRESS_SCENARIOS of them
# (the default suite runs 25), drawn afresh each time.
STRESS_REPETITIONS ?= 30
STRESS_SCENARIOS ?= 500
stress: $(VENV)/.installed-test
	$(PY) benchmarks/stress.py $(STRESS_REPETITIONS)
	REFDDP_SCENARIOS=$(STRESS_SCENARIOS) $(PY) -m pytest -q -p no:cacheprovider \
		tests/training/test_step_scenarios.py --hypothesis-show-statistics

# The trainer's invariants at 256 ranks (tests/training/test_scale.py; ~4 min), then the harness
# from 8 to 1,024 ranks (benchmarks/harness_scale.py; ~4 min, 14 GiB).
scale: $(VENV)/.installed-test
	REFDDP_LARGE_WORLDS=1 $(PY) -m pytest tests/training/test_scale.py
	$(PY) benchmarks/harness_scale.py

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check refddp tests benchmarks examples conftest.py

bench: $(VENV)/.installed-test
	$(PY) -m pip install -q -c constraints.txt -e '.[bench]'
	$(PY) benchmarks/trainer_overhead.py
	$(PY) benchmarks/step_overhead.py

# Another torch: the compatibility subset in .venv-torch-$(TORCH) (docs/torch-versions.md).
# CI runs the declared range's floor and top: TORCH=2.5.0 SUITE=all (the whole suite but its
# slow and heavy tests, then the subset's slow ones), and TORCH=2.14.1 TORCHVISION=0.29.1 (the
# compatibility subset).
SUITE ?= subset
compat:
	@test -n "$(TORCH)" || { echo "usage: make compat TORCH=X.Y.Z [TORCHVISION=A.B.C] [SUITE=all]" >&2; exit 2; }
	COMPAT_SUITE=$(SUITE) bash .ci/compat $(TORCH) $(TORCHVISION)

clean:
	rm -rf $(VENV) .venv-torch-* runs

# Not part of CI: each curated mutant removes one mechanism; its tests must fail (docs/guarantees.md).
mutation: $(VENV)/.installed-test
	$(PY) tests/mutation/run.py
