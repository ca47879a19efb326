"""Registers the offloader's operator extra links with Airflow (needed to render them)."""

from airflow.plugins_manager import AirflowPlugin

from offloader_airflow.links import OffloadedObjectsLink


class OffloaderPlugin(AirflowPlugin):
    name = "offloader"
    operator_extra_links = [OffloadedObjectsLink()]
