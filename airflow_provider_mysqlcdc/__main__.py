import sys

from airflow_provider_mysqlcdc.cli import main

sys.exit(main())
