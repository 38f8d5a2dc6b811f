"""spark-submit entry point: snapshot one chunk group into the sink.

A thin wrapper so the job can be submitted from a checkout; the code lives in the installed
provider (``airflow_provider_mysqlcdc/jobs/snapshot.py``, which the snapshot operator submits by
default). See that module for the arguments.
"""

import sys

from airflow_provider_mysqlcdc.jobs.snapshot import main

if __name__ == "__main__":
    sys.exit(main())
