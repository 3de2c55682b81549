# The two commands of the README: `make run` and `make test`.
PY := .venv/bin/python

.PHONY: setup run test bench lock

# Installs exactly the lock in requirements/ (both venvs; a stamp skips it when nothing changed).
setup:
	bash scripts/setup.sh

# Refreshes the lock (keeps every pin that still fits; `bash scripts/lock.sh --upgrade` for newer ones).
lock:
	bash scripts/lock.sh

run: setup
	$(PY) launch/ds_libero_ppo.py --clip-mode soft_clip

test: setup
	$(PY) -m pytest tests -q -p no:cacheprovider --timeout=900

bench: setup
	for b in env_raw weight_sync inference throughput async_vs_sync learning chaos; do \
		$(PY) benchmarks/bench_$$b.py --quick --out runs/bench/$$b.json || exit 1; done
