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

bench: setup-dev
	for b in env_raw weight_sync inference throughput async_vs_sync learning chaos; do \
		$(PY) benchmarks/bench_$$b.py --quick --out runs/bench/$$b.json || exit 1; done
