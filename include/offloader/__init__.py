"""Tiered storage for sealed log ledgers.

The library holds everything that does the work; Airflow (plugins/, dags/) only calls it.
"""

__version__ = "0.1.0"
