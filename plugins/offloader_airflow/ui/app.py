"""The FastAPI app of the tiered-storage view: ``/`` (HTML), ``/api/tiers`` (JSON) and
``/metrics`` (Prometheus text); who may read them: ``access.py``.

Every process that loads plugins (workers, scheduler, dag-processor) imports this module,
so Airflow's API-server modules are imported only inside the routes, in the API server.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response

from offloader.exceptions import OffloaderError
from offloader.metadata import MetadataStore
from offloader.status import tiers_report
from offloader_airflow.hooks import OffloaderConnectionError, OffloaderHook
from offloader_airflow.ui.access import (
    FORBIDDEN,
    may_view,
    permitted_user,
    readable_run_dag_ids,
    scraper_or_user,
    signed_in_or_none,
)
from offloader_airflow.ui.page import render_page

log = logging.getLogger(__name__)

URL_PREFIX = "/offloader"
app = FastAPI(title="Tiered storage", docs_url=None, redoc_url=None, openapi_url=None)
FASTAPI_APP = {"app": app, "url_prefix": URL_PREFIX, "name": "Tiered storage"}
#: The entry in the UI's navigation: the page, embedded under /plugin/tiered-storage.
EXTERNAL_VIEW = {
    "name": "Tiered storage",
    "href": f"{URL_PREFIX}/",
    "destination": "nav",
    "category": "browse",
    "url_route": "tiered-storage",
}


def collect(user: Any) -> dict[str, Any]:
    """What the page and the API show: the tiers (or why they cannot be read) and the last
    runs of the DAGs the user may read."""
    from airflow.utils.session import create_session

    from offloader_airflow.ui.dag_runs import last_runs

    with create_session() as session:
        dags = last_runs(session, readable_run_dag_ids(user, session))
    return {"dags": dags, **tiers_state(OffloaderHook())}


def tiers_state(hook: OffloaderHook) -> dict[str, Any]:
    """The stores (URLs without passwords) and the tiers report; or, if they cannot be
    read, ``error``: a message that names what is wrong and never carries a secret."""
    try:
        # the metadata only: a whole Runtime would create the hot tier's and the store's
        # directories on the API server's host, or open an S3 session, for a read-only page
        settings = hook.get_settings()
        metadata = MetadataStore.open(settings.resolved_metadata_url)
        try:
            report = tiers_report(metadata, settings.gc_failing_tries)
        finally:
            metadata.close()
        store = {
            "metadata_url": hook.connection.safe_metadata_url,
            "object_store_url": settings.resolved_object_store_url,
        }
    except (OffloaderConnectionError, OffloaderError) as exc:
        return {"error": str(exc)}  # ours: they name the field or the revision, no secret
    except Exception as exc:
        # a driver's message may quote a URL: the log has it (masked), the page not
        log.exception("tiered-storage view: reading the offloader metadata failed")
        return {"error": f"{type(exc).__name__} reading the offloader metadata; see the log"}
    return {"error": None, "store": store, "report": report.model_dump(mode="json")}


@app.get("/api/tiers")
def api_tiers(user: Annotated[Any, Depends(permitted_user)]) -> Any:
    result = collect(user)
    if result["error"]:
        raise HTTPException(status_code=503, detail=result["error"])
    return result


@app.get("/", response_class=HTMLResponse)
def page(
    request: Request,
    user: Annotated[Any, Depends(signed_in_or_none)],
) -> Response:
    if user is None:
        from airflow.api_fastapi.app import get_auth_manager

        login = get_auth_manager().get_url_login(next_url=str(request.url))
        return RedirectResponse(login, status_code=303)
    if not may_view(user):
        return HTMLResponse(f"<!doctype html><title>Forbidden</title><p>{FORBIDDEN}</p>", 403)
    return HTMLResponse(render_page(collect(user)))


@app.get("/metrics", dependencies=[Depends(scraper_or_user)])
def metrics() -> Response:
    from offloader_airflow.ui.metrics import CONTENT_TYPE, MetricsUnavailableError, metrics_text

    try:
        text = metrics_text(OffloaderHook())
    except MetricsUnavailableError as exc:  # its message names what is wrong, no secret
        return PlainTextResponse(str(exc), status_code=503)
    return Response(text, media_type=CONTENT_TYPE)
