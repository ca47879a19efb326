"""Without chromium the browser tests skip with the fix, except in CI, where they fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures import browser


@pytest.mark.parametrize("ci", ["true", "1"])
def test_a_missing_browser_fails_in_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ci: str
) -> None:
    monkeypatch.setattr(browser, "CHROMIUM", tmp_path / "chromium")
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match=r"chromium missing; run `make browser`.*CI"):
        browser.require_chromium()


@pytest.mark.parametrize("ci", [None, "", "false"])
def test_a_missing_browser_skips_with_the_fix_elsewhere(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ci: str | None
) -> None:
    monkeypatch.setattr(browser, "CHROMEDRIVER", tmp_path / "chromedriver")
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match=r"chromedriver missing; run `make browser`"):
        browser.require_chromium()
