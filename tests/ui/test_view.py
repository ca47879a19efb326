"""The tiered-storage view in a real Airflow API server and a real headless chromium: the
numbers of a known setup, a screenshot kept as an artifact (who may open it: test_access)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from fixtures.airflow import DAGS
from fixtures.airflow_server import AirflowServer, api_get
from fixtures.backends import make_topic, produce_ledgers
from fixtures.browser import Screenshots, sign_in, until
from offloader.metadata.records import Position
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.retention.trim import trim_topic
from offloader.runtime import Runtime

DAG_IDS = sorted(p.stem for p in DAGS.glob("*.py"))

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

#: per topic (hot ledgers, hot bytes, offloaded ledgers, offloaded bytes, pending deletions)
Tiers = dict[str, tuple[int, int, int, int, int]]

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.xdist_group("airflow_server")]


@pytest.fixture(scope="module")
def known_setup(
    airflow_server: AirflowServer,
) -> Iterator[Tiers]:
    """Two topics: `orders` with two of three ledgers offloaded, their hot copies deleted and
    the first trimmed (its two objects queued for deletion); `clicks` only hot. The expected
    (hot ledgers, hot bytes, offloaded ledgers, offloaded bytes, pending deletions) come from
    the ledger rows and the offload results, not from the code under test."""
    with Runtime.open(airflow_server.settings) as rt:
        make_topic(rt, "orders")
        make_topic(rt, "clicks")
        orders = produce_ledgers(rt, "orders", [(40, 3000), (30, 3000), (20, 3000)], seed=1)
        produce_ledgers(rt, "clicks", [(50, 500), (10, 500)], seed=2)
        results = LedgerOffloader(rt).offload_topic("orders", up_to=orders[1])
        assert [r.ledger_id for r in results] == orders[:2]
        delete_hot_copies(rt.metadata, rt.hot, "orders")
        trim_topic(rt, "orders", Position(ledger_id=orders[1], entry_id=0))
        expected = {}
        for topic in ("orders", "clicks"):
            ledgers = rt.metadata.list_ledgers(topic)
            moved = orders[:2] if topic == "orders" else []
            hot = [x.size_bytes for x in ledgers if x.ledger_id not in moved]
            off = [x.data_len or 0 for x in ledgers if x.ledger_id in moved]
            pending = 2 if topic == "orders" else 0
            expected[topic] = (len(hot), sum(hot), len(off), sum(off), pending)
    assert expected["orders"][3] > 0 and expected["clicks"][1] > 0
    yield expected


@pytest.fixture(scope="module")
def backfill(airflow_server: AirflowServer) -> list[str]:
    """Three hourly runs of garbage_collection, made by `airflow backfill create` (queued:
    no scheduler runs here); their run ids."""
    airflow_server.airflow(
        "backfill",
        "create",
        "--dag-id",
        "garbage_collection",
        "--from-date",
        "2026-01-01T00:00:00",
        "--to-date",
        "2026-01-01T02:00:00",
        "--dag-run-conf",
        '{"dry_run": true}',
    )
    return [f"backfill__2026-01-01T0{h}:00:00+00:00" for h in range(3)]


def test_the_api_reports_the_known_setup(
    airflow_server: AirflowServer, known_setup: Tiers, backfill: list[str]
) -> None:
    data = api_get(airflow_server, "/offloader/api/tiers")
    body = json.dumps(data)
    got = {
        t["topic"]: (
            t["hot_ledgers"],
            t["hot_bytes"],
            t["offloaded_ledgers"],
            t["offloaded_bytes"],
            t["pending_deletions"],
        )
        for t in data["report"]["topics"]
    }
    assert got == known_setup
    assert data["report"]["deletion_backlog"]["pending"] == 2
    dags = {d["dag_id"]: d["runs"] for d in data["dags"]}
    assert sorted(dags) == DAG_IDS
    backfilled = [r for r in dags["garbage_collection"] if r["run_type"] == "backfill"]
    assert sorted(r["run_id"] for r in backfilled) == backfill
    assert {r["state"] for r in backfilled} == {"queued"}
    assert airflow_server.password not in body
    assert airflow_server.env["AIRFLOW__API_AUTH__JWT_SECRET"] not in body


def test_the_view_in_the_browser_shows_the_known_setup(
    airflow_server: AirflowServer,
    known_setup: Tiers,
    backfill: list[str],
    browser: WebDriver,
    screenshots: Screenshots,
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    # through the UI's navigation: the external view embeds the page in an iframe
    sign_in(browser, airflow_server, f"{airflow_server.base_url}/")
    browse = (By.CSS_SELECTOR, "button[aria-label=Browse]")
    until(browser, ec.element_to_be_clickable(browse), "the Browse menu").click()
    entry = (By.LINK_TEXT, "Tiered storage")
    until(browser, ec.element_to_be_clickable(entry), "Browse > Tiered storage").click()
    until(browser, ec.url_contains("/plugin/tiered-storage"), "the view's URL")
    iframe = (By.TAG_NAME, "iframe")
    until(browser, ec.frame_to_be_available_and_switch_to_it(iframe), "the view's iframe")
    try:
        until(browser, ec.presence_of_element_located((By.ID, "topics")), "the topics table")
        for topic, (hot_n, hot_b, off_n, off_b, pending) in known_setup.items():
            row = browser.find_element(By.CSS_SELECTOR, f"tr[data-topic='{topic}']")

            def cell(field: str) -> str:
                return row.find_element(By.CSS_SELECTOR, f"[data-field={field}]").text  # noqa: B023

            assert cell("hot_ledgers") == str(hot_n)
            assert cell("hot_bytes").startswith(f"{hot_b:,} B")
            assert cell("offloaded_ledgers") == str(off_n)
            assert cell("offloaded_bytes").startswith(f"{off_b:,} B")
            assert cell("pending_deletions") == str(pending)
        backlog = browser.find_element(By.ID, "backlog")
        assert backlog.find_element(By.CSS_SELECTOR, "[data-field=pending]").text == "2"
        assert browser.find_element(By.ID, "chart-hot").get_attribute("points")
        assert browser.find_element(By.ID, "chart-offloaded").get_attribute("points")
        dags = {
            e.get_attribute("data-dag")
            for e in browser.find_elements(By.CSS_SELECTOR, "tr[data-dag]")
        }
        assert dags == set(DAG_IDS)
        for run_id in backfill:
            row = browser.find_element(
                By.XPATH, f"//tr[@data-dag='garbage_collection'][td/a='{run_id}']"
            )
            assert [td.text for td in row.find_elements(By.TAG_NAME, "td")][2:4] == [
                "backfill",
                "queued",
            ]
        assert airflow_server.password not in browser.page_source
    finally:
        browser.switch_to.default_content()
    size = browser.get_window_size()
    browser.set_window_size(size["width"], 1500)  # the whole page, for the docs
    try:
        screenshots.save(browser, "tiered-storage-view", doc=True)
    finally:
        browser.set_window_size(size["width"], size["height"])
