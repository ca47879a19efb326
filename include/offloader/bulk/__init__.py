"""Bulk jobs over offloaded data (the Spark side runs them, include/spark_jobs/): plain
Python here, no Spark import, so planning, slicing, Parquet and publishing are testable
without a cluster and the executors only need this package."""
