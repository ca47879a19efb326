"""Registers the offloader with Airflow: the operator extra links (needed to render them)
and the tiered-storage view (a FastAPI app in the API server, an entry in the navigation)."""

from airflow.plugins_manager import AirflowPlugin

from offloader_airflow.links import OffloadedObjectsLink
from offloader_airflow.ui import EXTERNAL_VIEW, FASTAPI_APP


class OffloaderPlugin(AirflowPlugin):
    name = "offloader"
    operator_extra_links = [OffloadedObjectsLink()]
    fastapi_apps = [FASTAPI_APP]
    external_views = [EXTERNAL_VIEW]
