"""spark-submit entry point: the long-lived binlog stream of a pipeline into the sink.

A thin wrapper so the job can be submitted from a checkout; the code lives in the installed
provider (``airflow_provider_mysqlcdc/jobs/stream.py``, which the stream operator submits by
default). See that module for the arguments.
"""

import sys

from airflow_provider_mysqlcdc.jobs.stream import main

if __name__ == "__main__":
    sys.exit(main())
