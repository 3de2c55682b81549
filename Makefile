# The two commands of the README: `make run` and `make test`.
PY := .venv/bin/python

.PHONY: setup setup-dev run test bench

setup:
	bash scripts/setup.sh

setup-dev:
	bash scripts/setup.sh --dev

run: setup
	$(PY) launch/ds_libero_ppo.py --clip-mode soft_clip

test: setup-dev
	$(PY) -m pytest tests -q -p no:cacheprovider --timeout=900

bench: setup
	$(PY) benchmarks/bench_env_raw.py --seconds 5
