# The two commands of the README: `make run` and `make test`.
PY := .venv/bin/python

.PHONY: setup run test lint bench lock durations peers coverage

# Installs exactly the lock in requirements/ (both venvs; a stamp skips it when nothing changed).
setup:
	bash scripts/setup.sh

# Refreshes the lock (keeps every pin that still fits; `bash scripts/lock.sh --upgrade` for newer ones).
lock:
	bash scripts/lock.sh

run: setup
	$(PY) launch/ds_libero_ppo.py --clip-mode soft_clip

# The linter, then the type checker (pyproject.toml [tool.ruff], [tool.mypy]): a finding fails `make test` before any
# test runs.
test: setup
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest tests -q -p no:cacheprovider --timeout=900

# The linter and the type checker alone (what `make test` runs first); `.venv/bin/python -m ruff check --fix .` applies
# ruff's safe fixes.
lint: setup
	$(PY) -m ruff check .
	$(PY) -m mypy

# What `make test` runs, under coverage.py (.coveragerc): line coverage of async_rl/ and envs/, Ray actors and
# subprocesses included, into tests/coverage.json (tests/README.md, Coverage; per file: runs/coverage/report.txt).
# `make coverage FILES="tests/test_x.py" OUT=runs/coverage/partial.json` measures some files only.
coverage: setup
	$(PY) tests/coverage_record.py --out $(or $(OUT),tests/coverage.json) -- \
		$(PY) -m pytest $(or $(FILES),tests) -q -p no:cacheprovider --timeout=900

bench: setup
	for b in env_raw weight_sync inference throughput async_vs_sync learning chaos; do \
		$(PY) benchmarks/bench_$$b.py --quick --out runs/bench/$$b.json || exit 1; done

# Per-file and per-test wall time into tests/durations.json, with the machine's speed (the raw MetaWorld
# env's steps/s) and load; `make durations FILES="tests/policies/test_bf16.py tests/e2e/test_faults.py"` refreshes some files.
durations: setup
	$(PY) benchmarks/bench_env_raw.py --workers 1 --seconds 10 --out runs/bench/machine_speed.json
	$(PY) -m pytest $(or $(FILES),tests) -q -p no:cacheprovider --timeout=900 --durations=0 \
		--durations-json=tests/durations.json --durations-machine=runs/bench/machine_speed.json

# The peer benchmark's extra (TRL, requirements/peers.lock.txt, hashes checked) into .venv-peers/site-packages:
# never installed by setup or run; benchmarks/bench_lm_peers.py puts it on its TRL process's path only.
peers: setup
	$(PY) -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps --upgrade \
		--target .venv-peers/site-packages -r requirements/peers.lock.txt
