"""The Airflow side of the offloader: a hook, thin operators, extra links and the plugin.

All work happens in the ``offloader`` library; this package only turns Airflow connections
into library settings and Airflow task calls into library calls.
"""
