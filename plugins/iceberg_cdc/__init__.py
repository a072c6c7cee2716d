"""Change data capture from Apache Iceberg tables through an S3 hash shuffle.

The package is shared by the Airflow DAGs, the Spark jobs (shipped to executors
with ``--py-files``) and the tests, so it depends only on pyarrow, numpy, lz4,
boto3 and pyiceberg-core at import time of its engine modules.
"""

__version__ = "0.1.0"
