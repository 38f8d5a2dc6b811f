# The two commands a new user needs (see README.md):
#   make demo   - run the whole pipeline end to end on the embedded default
#   make test   - run the test suite (real MariaDB, real Spark local[2], real Airflow test mode)
.PHONY: bootstrap server-roots test demo demo-stop lint bench-split

LINT_PATHS := $(wildcard airflow_provider_mysqlcdc dags spark_jobs tests bench demo)

bootstrap:
	bash scripts/bootstrap.sh

# The Debian roots MySQL 9.7 and MariaDB 11.8 run from in the tests (bootstrap builds them when missing;
# cached outside the repo in $$MYSQLCDC_SERVER_ROOTS, default /var/cache/mysqlcdc/roots).
server-roots:
	bash scripts/server_roots.sh

lint: bootstrap
	.venv/bin/ruff check $(LINT_PATHS)
	.venv/bin/lint-imports

# Test modules run in PYTEST_WORKERS processes (pytest-xdist, a module's tests together): most of a
# test waits on its servers (MariaDB, Spark, Airflow), so two overlap well on two cores. 0 = one process.
PYTEST_WORKERS ?= 2

test: bootstrap
	.venv/bin/ruff check $(LINT_PATHS)
	.venv/bin/lint-imports
	.venv/bin/python -m pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile --durations=15 $(PYTEST_ARGS)

demo: bootstrap
	.venv/bin/python -m demo.run $(ARGS)

demo-stop:
	.venv/bin/python -m demo.run --stop

bench-split: bootstrap
	.venv/bin/python bench/split.py
