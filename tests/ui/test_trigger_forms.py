"""Every DAG's trigger form in Airflow's own UI, in a real headless chromium: submitted with
its defaults it creates a run with those defaults; a bad value is refused and shown.

Airflow's form checks some things itself (a required value that is missing, shown under the
field; a number outside its bounds, set back to the bound) and leaves the rest (a pattern)
to the API, whose refusal naming the param the dialog shows above the form.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from fixtures.airflow import DAGS
from fixtures.airflow_server import AirflowServer, api_get
from fixtures.browser import Screenshots, sign_in, until

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.remote.webelement import WebElement

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.xdist_group("airflow_server")]

DAG_IDS = sorted(p.stem for p in DAGS.glob("*.py"))
#: Per DAG a bad value: (field, value typed, message, shown under the field?)
BAD_VALUES = {
    "offload_ledgers": ("batch_size", "", "This field is required", True),
    "offload_historical": ("batch_size", "", "This field is required", True),
    "garbage_collection": ("max_items", "", "This field is required", True),
    "bulk_export": ("slice_bytes", "", "This field is required", True),
    "bulk_rewrite": ("max_groups", "", "This field is required", True),
    "retention": ("position", "abc", "Invalid input for param position", False),
    "scrub": ("report", "abc", "Invalid input for param report", False),
    "streaming_offload": ("topic", " events", "Invalid input for param topic", False),
}


def runs(server: AirflowServer, dag_id: str) -> list[dict[str, Any]]:
    return api_get(server, f"/api/v2/dags/{dag_id}/dagRuns")["dag_runs"]


def open_form(
    browser: WebDriver, server: AirflowServer, dag_id: str
) -> tuple[WebElement, WebElement]:
    """The DAG's page, its Trigger button, the open dialog (with its Trigger button)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    sign_in(browser, server, f"{server.base_url}/dags/{dag_id}")
    button = (By.CSS_SELECTOR, "button[aria-label='Trigger Dag']")
    until(browser, ec.element_to_be_clickable(button), f"{dag_id}'s Trigger button").click()
    open_dialog = (By.CSS_SELECTOR, "[role=dialog][data-state=open]")
    dialog = until(browser, ec.visibility_of_element_located(open_dialog), "the trigger dialog")
    fields = (By.CSS_SELECTOR, "[name^='element_']")  # not every DAG has a dry_run field
    until(browser, lambda _: dialog.find_elements(*fields), "the Params' fields")
    return dialog, submit_button(dialog)


def submit_button(dialog: WebElement) -> WebElement:
    from selenium.webdriver.common.by import By

    buttons = [
        b for b in dialog.find_elements(By.TAG_NAME, "button") if b.text.strip() == "Trigger"
    ]
    assert len(buttons) == 1, [b.text for b in buttons]
    return buttons[0]


def type_into(browser: WebDriver, dialog: WebElement, name: str, value: str) -> WebElement:
    """Replace the field's value as a person would, then leave the field."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    field = dialog.find_element(By.NAME, f"element_{name}")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", field)
    field.click()
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(Keys.DELETE)
    if value:
        field.send_keys(value)
    field.send_keys(Keys.TAB)
    return field


def test_every_dag_has_a_bad_value_case() -> None:
    assert sorted(BAD_VALUES) == DAG_IDS


@pytest.mark.parametrize("dag_id", DAG_IDS)
def test_the_form_submitted_with_its_defaults_creates_a_run(
    airflow_server: AirflowServer,
    browser: WebDriver,
    screenshots: Screenshots,
    dag_id: str,
) -> None:
    before = {r["dag_run_id"] for r in runs(airflow_server, dag_id)}
    defaults = {
        k: v["value"]
        for k, v in api_get(airflow_server, f"/api/v2/dags/{dag_id}/details")["params"].items()
    }
    dialog, trigger = open_form(browser, airflow_server, dag_id)
    if dag_id == "offload_ledgers":
        screenshots.save(browser, "trigger-form", doc=True)
    assert trigger.is_enabled(), f"{dag_id}: the form refuses its own defaults:\n{dialog.text}"
    trigger.click()
    new = until(
        browser,
        lambda _: [r for r in runs(airflow_server, dag_id) if r["dag_run_id"] not in before],
        f"a new run of {dag_id}",
    )
    assert len(new) == 1
    assert new[0]["run_type"] == "manual"
    assert new[0]["state"] in ("queued", "running")  # no scheduler runs here: queued
    assert new[0]["conf"] == defaults


@pytest.mark.parametrize("dag_id", DAG_IDS)
def test_a_bad_value_is_refused_and_shown(
    airflow_server: AirflowServer,
    browser: WebDriver,
    screenshots: Screenshots,
    dag_id: str,
) -> None:
    from selenium.webdriver.common.by import By

    name, value, message, under_the_field = BAD_VALUES[dag_id]
    before = len(runs(airflow_server, dag_id))
    dialog, trigger = open_form(browser, airflow_server, dag_id)
    field = type_into(browser, dialog, name, value)
    if under_the_field:
        root = field.find_element(
            By.XPATH, "ancestor::*[@data-scope='field' and @data-part='root'][1]"
        )
        errors = until(
            browser,
            lambda _: [
                e.text for e in root.find_elements(By.CSS_SELECTOR, "[data-part=error-text]")
            ],
            f"the error under {name}",
        )
        assert errors == [message]
        assert field.get_attribute("aria-invalid") == "true"
        assert not trigger.is_enabled()
        if dag_id == "offload_ledgers":
            screenshots.save(browser, "trigger-form-error", doc=True)
    else:
        trigger.click()
        until(browser, lambda _: message in dialog.text, f"the API's refusal of {name}={value!r}")
        assert dialog.is_displayed()
        screenshots.save(browser, f"trigger-form-error-{dag_id}")
    assert len(runs(airflow_server, dag_id)) == before


def test_a_number_below_its_minimum_is_set_back_to_the_minimum(
    airflow_server: AirflowServer,
    browser: WebDriver,
) -> None:
    """batch_size 0 cannot be submitted: the form's number field keeps to minimum 1."""
    dialog, _ = open_form(browser, airflow_server, "offload_ledgers")
    field = type_into(browser, dialog, "batch_size", "0")
    assert field.get_attribute("aria-valuemin") == "1"
    until(browser, lambda _: field.get_attribute("value") == "1", "batch_size set back to 1")
