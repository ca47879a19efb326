"""The FastAPI app of the tiered-storage view: ``/`` (HTML) and ``/api/tiers`` (JSON)."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, bearer_scheme, get_user
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials

from offloader.exceptions import OffloaderError
from offloader.status import tiers_report
from offloader_airflow.hooks import OffloaderConnectionError, OffloaderHook
from offloader_airflow.ui.dag_runs import last_runs
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


async def _signed_in_or_none(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> BaseUser | None:
    """The page redirects to the login page instead of answering 401."""
    try:
        return await get_user(request, None, bearer)
    except HTTPException:
        return None


def collect(user: BaseUser, session: Any) -> dict[str, Any]:
    """What the page and the API show: the tiers (or why they cannot be read) and the last
    runs of the DAGs the user may read."""
    dag_ids = get_auth_manager().get_authorized_dag_ids(user=user, method="GET")
    return {"dags": last_runs(session, dag_ids), **tiers_state(OffloaderHook())}


def tiers_state(hook: OffloaderHook) -> dict[str, Any]:
    """The stores (URLs without passwords) and the tiers report; or, if they cannot be
    read, ``error``: a message that names what is wrong and never carries a secret."""
    try:
        with hook.get_runtime() as runtime:
            report = tiers_report(runtime.metadata, runtime.settings.gc_failing_tries)
            store = {
                "metadata_url": hook.connection.safe_metadata_url,
                "object_store_url": runtime.objects.url,
            }
    except (OffloaderConnectionError, OffloaderError) as exc:
        return {"error": str(exc)}  # ours: they name the field or the revision, no secret
    except Exception as exc:
        # a driver's message may quote a URL: the log has it (masked), the page not
        log.exception("tiered-storage view: reading the offloader metadata failed")
        return {"error": f"{type(exc).__name__} reading the offloader metadata; see the log"}
    return {"error": None, "store": store, "report": report.model_dump(mode="json")}


@app.get("/api/tiers")
def api_tiers(user: GetUserDep, session: SessionDep) -> Any:
    result = collect(user, session)
    if result["error"]:
        raise HTTPException(status_code=503, detail=result["error"])
    return result


@app.get("/", response_class=HTMLResponse)
def page(
    request: Request,
    user: Annotated[BaseUser | None, Depends(_signed_in_or_none)],
    session: SessionDep,
) -> Response:
    if user is None:
        login = get_auth_manager().get_url_login(next_url=str(request.url))
        return RedirectResponse(login, status_code=303)
    return HTMLResponse(render_page(collect(user, session)))
