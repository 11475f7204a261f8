"""The report in a real headless Chromium: no console errors, every episode listed, steps with
gold passages marked, filters, the side-by-side view, a screenshot kept as an artifact."""

from __future__ import annotations

import pytest

from tests.view.browser import ARTIFACTS, chrome, requires_chromium
from tests.view.conftest import AGENTS, N, write_training_run

pytestmark = [requires_chromium, pytest.mark.slow]


@pytest.fixture(scope="module")
def driver():
    d = chrome()
    yield d
    d.quit()


@pytest.fixture(scope="module")
def report(eval_run):
    pytest.importorskip("jinja2", reason="rag-gym view needs Jinja2: pip install 'rag-gym[view]'")
    from rag_gym.view import build_report

    return build_report(eval_run)


def console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def open_report(driver, path):
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(path.resolve().as_uri())
    WebDriverWait(driver, 10).until(
        lambda d: d.execute_script("return document.body.dataset.ready") == "1"
    )


def css(driver, selector):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def choose(driver, select_id, value):
    from selenium.webdriver.support.ui import Select

    Select(css(driver, f"#{select_id}")[0]).select_by_value(value)


def test_report_in_chromium(driver, report, eval_run):
    import json

    episodes = [json.loads(line) for line in (eval_run / "episodes.jsonl").read_text().splitlines()]
    open_report(driver, report)
    assert console_errors(driver) == []
    # the leaderboard lists every agent and sorts on a click
    assert len(css(driver, "#leaderboard tr.lb-row")) == len(AGENTS)
    css(driver, '#leaderboard th[data-key="agent"]')[0].click()
    names = [r.text.split()[0] for r in css(driver, "#leaderboard tr.lb-row")]
    assert names == sorted(AGENTS)

    # the episode browser shows as many episodes as the run has
    css(driver, '#tabs button[data-tab="episodes"]')[0].click()
    count = css(driver, "#episode-count")[0]
    assert int(count.get_attribute("data-count")) == len(episodes) == N * len(AGENTS)
    rows = css(driver, "tr.episode-row")
    assert len(rows) == len(episodes)  # one page (50 per page)

    # clicking an episode shows its steps, the gold passages marked
    naive = next(i for i, e in enumerate(episodes) if e["agent"] == "naive_rag" and e["gold_ids"])
    css(driver, f'tr.episode-row[data-i="{naive}"]')[0].click()
    steps = css(driver, "#episode-detail .step")
    assert len(steps) == episodes[naive]["steps"] == 2
    assert "SEARCH" in steps[0].text and "ANSWER" in steps[1].text
    shown = css(driver, "#episode-detail .step .passage")
    gold = {p.get_attribute("data-id") for p in shown if p.get_attribute("data-gold") == "1"}
    retrieved = episodes[naive]["retrieved_ids"]
    assert [p.get_attribute("data-id") for p in shown] == retrieved
    assert gold == set(retrieved) & set(episodes[naive]["gold_ids"])
    for p in css(driver, "#episode-detail .passage.gold"):
        assert p.value_of_css_property("background-color") != "rgba(0, 0, 0, 0)"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(ARTIFACTS / "report-episode.png"))

    # a filter narrows the list
    choose(driver, "f-agent", "random")
    assert int(count.get_attribute("data-count")) == N
    choose(driver, "f-outcome", "correct")
    correct = [
        e
        for e in episodes
        if e["agent"] == "random" and ((e["em"] == 1.0) if e["answerable"] else e["refused"])
    ]
    assert int(count.get_attribute("data-count")) == len(correct) < N
    choose(driver, "f-agent", "")
    choose(driver, "f-outcome", "")
    search = css(driver, "#f-text")[0]
    search.send_keys(episodes[0]["question_id"])
    assert int(count.get_attribute("data-count")) == len(AGENTS)
    search.clear()

    # one question across all agents
    css(driver, "#to-compare")[0].click()
    columns = css(driver, "#compare-grid .agent-column")
    assert sorted(c.get_attribute("data-agent") for c in columns) == sorted(AGENTS)
    assert all(c.find_elements("css selector", ".step") for c in columns)
    assert driver.save_screenshot(str(ARTIFACTS / "report-compare.png"))
    assert console_errors(driver) == []


def test_training_report_in_chromium(driver, tmp_path):
    pytest.importorskip("jinja2", reason="rag-gym view needs Jinja2: pip install 'rag-gym[view]'")
    from rag_gym.view import build_report

    report = build_report(write_training_run(tmp_path / "train"))
    open_report(driver, report)
    assert console_errors(driver) == []
    tab = css(driver, "#tab-training")[0]
    assert tab.is_displayed()  # a run without episodes opens on its training tab
    assert len(tab.find_elements("css selector", ".plots img")) >= 2
    assert len(css(driver, "#rollouts .rollout")) == 2  # the last sampled step's
    choose(driver, "rollout-step", "1")
    texts = [r.text for r in css(driver, "#rollouts .rollout")]
    assert len(texts) == 2 and all("at step 1" in t for t in texts)
    assert driver.save_screenshot(str(ARTIFACTS / "report-training.png"))
