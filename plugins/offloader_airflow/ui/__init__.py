"""The tiered-storage view: an HTML page and a JSON API, mounted into Airflow's API server
by the plugin (``plugins/offloader_plugin.py``) and linked from the UI's navigation.

Only signed-in Airflow users see either (the auth manager checks the JWT cookie or bearer
token); neither shows a secret: the metadata URL is rendered without its password.
"""

from offloader_airflow.ui.app import EXTERNAL_VIEW, FASTAPI_APP, URL_PREFIX, app

__all__ = ["EXTERNAL_VIEW", "FASTAPI_APP", "URL_PREFIX", "app"]
