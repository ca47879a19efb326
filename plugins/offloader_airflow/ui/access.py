"""Who may open the tiered-storage view and scrape its metrics.

Airflow neither authenticates nor authorises a plugin's FastAPI app: these dependencies do
both. Authentication is Airflow's own (``get_user``: a bearer JWT, else the UI's session
cookie). Authorisation asks the auth manager whether the user may ``GET`` the custom view
:data:`RESOURCE_NAME` (``is_authorized_custom_view``), not Airflow's Plugins page
(``is_authorized_view(AccessView.PLUGINS)``): a deployment then grants the tiers separately
from the list of installed plugins. The SimpleAuthManager lets every user with a role (viewer
and up) in; FAB, Keycloak and AWS check a permission on that resource.

``/metrics`` also takes a static scrape token for Prometheus, the password of the Airflow
connection :data:`SCRAPE_CONN_ID` (so it lives where operators keep secrets, masked by
Airflow), compared in constant time. A bearer that is not the token goes on to Airflow's
check, so an Airflow API token works there as well.

Every process that loads plugins imports this module: Airflow's API-server modules are
imported inside the functions only.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

log = logging.getLogger(__name__)

#: The custom view the auth manager is asked about (method ``GET``).
RESOURCE_NAME = "Tiered Storage"
#: The connection whose password is the scrape token of ``/offloader/metrics``.
SCRAPE_CONN_ID = "offloader_metrics"

_bearer = HTTPBearer(auto_error=False)
Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


#: Why a signed-in user gets 403 (the API's ``detail``, the page's text).
FORBIDDEN = f"Forbidden: the tiered-storage view needs GET on the custom view {RESOURCE_NAME!r}"


async def signed_in_user(request: Request, bearer: Bearer) -> Any:
    """Airflow's own authentication: 401 without a token or cookie (or an expired one),
    403 for an invalid token."""
    from airflow.api_fastapi.core_api.security import get_user

    return await get_user(request, None, bearer)


def may_view(user: Any) -> bool:
    """Whether the auth manager lets ``user`` read the tiered-storage view."""
    from airflow.api_fastapi.app import get_auth_manager

    return bool(
        get_auth_manager().is_authorized_custom_view(
            method="GET", resource_name=RESOURCE_NAME, user=user
        )
    )


async def permitted_user(request: Request, bearer: Bearer) -> Any:
    """The API's dependency: 401 anonymous, 403 invalid token or not permitted."""
    user = await signed_in_user(request, bearer)
    if not await run_in_threadpool(may_view, user):  # an auth manager may ask a database
        raise HTTPException(status_code=403, detail=FORBIDDEN)
    return user


async def signed_in_or_none(request: Request, bearer: Bearer) -> Any:
    """The page's dependency: None when nobody is signed in (the page then sends the
    browser to the login page instead of answering 401); the page checks the permission
    itself, to answer 403 in HTML."""
    try:
        return await signed_in_user(request, bearer)
    except HTTPException:
        return None


async def scraper_or_user(request: Request, bearer: Bearer) -> None:
    """``/metrics``: the scrape token, else a permitted Airflow user (401 with neither,
    403 for a bearer that is neither the token nor a valid Airflow token)."""
    if bearer is not None and bearer.scheme.lower() == "bearer":
        token = await run_in_threadpool(scrape_token)  # a database or a secrets backend
        if token is not None and _same(bearer.credentials, token):
            return
    await permitted_user(request, bearer)


def scrape_token() -> str | None:
    """The password of the :data:`SCRAPE_CONN_ID` connection, masked; None when the
    connection or its password is missing (then only Airflow users may scrape)."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException
    from airflow.sdk.log import mask_secret

    try:
        conn = BaseHook.get_connection(SCRAPE_CONN_ID)
    except AirflowNotFoundException:
        return None
    except Exception as exc:  # a secrets backend down: Airflow users still get in
        log.warning(
            "the %s connection cannot be read (%s): only Airflow users may scrape",
            SCRAPE_CONN_ID,
            type(exc).__name__,
        )
        return None
    if not conn.password:
        return None
    mask_secret(conn.password)
    return str(conn.password)


def _same(presented: str, token: str) -> bool:
    """Constant-time equality that does not reveal the token's length either."""
    digest = hashlib.sha256
    return hmac.compare_digest(digest(presented.encode()).digest(), digest(token.encode()).digest())


def readable_run_dag_ids(user: Any, session: Any) -> set[str]:
    """The DAGs whose runs ``user`` may read: the DAGs the auth manager lets them read
    (``get_authorized_dag_ids``, teams included) whose runs it also lets them read."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import (
        DagAccessEntity,
        DagDetails,
    )

    manager = get_auth_manager()
    dag_ids = manager.get_authorized_dag_ids(user=user, method="GET", session=session)
    return {
        dag_id
        for dag_id in dag_ids
        if manager.is_authorized_dag(
            method="GET",
            access_entity=DagAccessEntity.RUN,
            details=DagDetails(id=dag_id),
            user=user,
        )
    }
