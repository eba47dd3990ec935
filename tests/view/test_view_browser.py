"""The viewer in headless Chromium against real run directories: curves draw and grow live, trajectories open.

Needs the Debian packages `chromium` and `chromium-driver` (`apt-get install -y chromium chromium-driver`)
and the `selenium` package; skipped only when Chromium is not installed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from asearch.files import iter_jsonl
from asearch.retrieval.server import serve_in_thread
from asearch.runs import RunDir
from asearch.view import ViewConfig, create_app

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
DOCS_IMAGE = Path(__file__).resolve().parents[2] / "docs" / "img" / "viewer.png"
FLAGS = (
    "--headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking "
    "--disable-component-update --disable-sync --window-size=1400,1000"
).split()

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
        reason="headless Chromium is not installed (apt-get install -y chromium chromium-driver)",
    ),
]


def drawn(driver, css: str) -> dict | None:
    """The first element matching `css` as {attribute: value}, read in one script call: the viewer redraws a
    chart when rows arrive, so an element found in one WebDriver call can be gone by the next (stale)."""
    return driver.execute_script(
        "const e = document.querySelector(arguments[0]);"
        "return e && Object.fromEntries([...e.attributes].map(a => [a.name, a.value]));",
        css,
    )


def waiter(driver):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, 20, ignored_exceptions=(StaleElementReferenceException,))


@contextlib.contextmanager
def chromium():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    with tempfile.TemporaryDirectory(prefix="asearch-chromium-") as profile:
        options.add_argument(f"--user-data-dir={profile}")
        driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
        try:
            yield driver
        finally:
            driver.quit()


def test_viewer_in_headless_chromium(runs_root, tmp_path):
    from selenium.webdriver.common.by import By

    root = tmp_path / "runs"
    shutil.copytree(runs_root, root)  # the test appends a metric row while the page is open
    rl = root / "demo-seed0" / "rl"
    newest = [t for _, t in iter_jsonl(rl / "trajectories.jsonl")][-1]  # first in the list (newest first)
    reward = 'figure.chart[data-title="Reward"] path.series[data-key="rollout/reward_mean"]'

    with serve_in_thread(create_app([root], ViewConfig(poll_s=0.25))) as url, chromium() as driver:
        wait = waiter(driver)
        driver.get(url + "/")
        path = wait.until(lambda d: drawn(d, reward))
        assert int(path["data-points"]) == 6  # one point per logged step
        d = path["d"]
        assert d.startswith("M") and d.count("L") == 5
        xs = [float(seg.split()[0]) for seg in d[1:].split("L")]
        assert xs == sorted(xs) and xs[0] < xs[-1]  # drawn left to right over the steps
        assert "eval-mini" in driver.find_element(By.ID, "evaluation").text

        # the staleness section: each histogram is one stacked band per bin, shares of every step's tokens
        behind = 'figure.chart[data-title="Tokens by versions behind"] path.band'
        bands = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, behind))
        assert driver.find_element(By.ID, "staleness").is_displayed()
        assert [b.get_attribute("data-bin") for b in bands] == ["0", "1", "2", "3", "4+"]
        ratio = driver.find_elements(By.CSS_SELECTOR, 'figure.chart[data-title^="Importance ratio"] path.band')
        assert len(ratio) == 9
        masked = driver.find_elements(By.CSS_SELECTOR, 'figure.chart[data-title="Masked by the correction"] path.series')
        assert {p.get_attribute("data-key") for p in masked} >= {"is/masked_frac", "staleness/masked_frac/1"}

        # live: a row appended by the trainer shows up without a reload
        RunDir(rl, tensorboard=False).log(7, {"rollout/reward_mean": 0.5, "rollout/accuracy": 0.5})
        wait.until(lambda d: (drawn(d, reward) or {}).get("data-points") == "7")
        driver.save_screenshot(str(tmp_path / "viewer.png"))

        # the trajectory browser: click the newest training trajectory and step through its turns
        driver.get(url + "/trajectories?run=demo-seed0-rl")
        driver.find_element(By.CSS_SELECTOR, "a.traj-link").click()
        article = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#detail article.trajectory"))
        assert article.find_element(By.CSS_SELECTOR, "h2.question").text == newest["question"]
        turns = article.find_elements(By.CSS_SELECTOR, "li.turn")
        assert len(turns) == len(newest["turns"]) == 3
        first, second = newest["turns"][0], newest["turns"][1]
        assert turns[0].is_displayed() and not turns[1].is_displayed()
        assert f'search("{first["argument"]}")' in turns[0].text
        assert first["observation"].strip().splitlines()[0] in turns[0].text  # the search result
        assert article.find_element(By.CSS_SELECTOR, ".stepper .pos").text == "Turn 1 / 3"
        chips = [c.text for c in article.find_elements(By.CSS_SELECTOR, ".stepper .chip")]
        assert chips == ["1 search", "2 read", "3 answer"]
        article.find_element(By.CSS_SELECTOR, ".stepper .next").click()
        assert turns[1].is_displayed() and not turns[0].is_displayed()
        assert second["output_text"].replace("</summary>", "").strip() in turns[1].text  # the model's summary
        assert "open=" in driver.current_url  # the opened trajectory has its own address
        driver.save_screenshot(str(tmp_path / "trajectory.png"))

        # model output is shown as text, never run as markup
        driver.get(url + "/trajectories?run=ask.json&open=0")
        question = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "h2.question"))
        assert "<script>window.__xss = 1</script>" in question.text
        assert driver.execute_script("return window.__xss === undefined")

        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == [], errors

    for name in ("viewer.png", "trajectory.png"):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")
    if os.environ.get("ASEARCH_UPDATE_DOCS") == "1":  # refresh the docs screenshot on request only
        DOCS_IMAGE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tmp_path / "viewer.png", DOCS_IMAGE)


def test_viewer_on_a_real_train_run(tiny_world_model_dir, train_command, subprocess_env, tmp_path):
    """The run directory `asearch train` itself writes (not one made for the test): its reward curve is
    drawn with one point per step, and a trajectory it logged opens with all its turns."""
    import subprocess

    from selenium.webdriver.common.by import By

    run = tmp_path / "runs" / "train-tiny"
    done = subprocess.run(
        train_command(tiny_world_model_dir, run, 4), env=subprocess_env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    logged = [t for _, t in iter_jsonl(run / "trajectories.jsonl")]
    reward = 'figure.chart[data-title="Reward"] path.series[data-key="rollout/reward_mean"]'
    with serve_in_thread(create_app([run.parent], ViewConfig(poll_s=0.25))) as url, chromium() as driver:
        wait = waiter(driver)
        driver.get(url + "/")
        path = wait.until(lambda d: drawn(d, reward))
        assert int(path["data-points"]) == 4
        bands = driver.find_elements(By.CSS_SELECTOR, 'figure.chart[data-title="Tokens by versions behind"] path.band')
        assert len(bands) == 5 and driver.find_element(By.ID, "staleness").is_displayed()  # what the trainer logged
        driver.get(url + "/trajectories?run=train-tiny")
        driver.find_element(By.CSS_SELECTOR, "a.traj-link").click()
        article = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#detail article.trajectory"))
        assert article.find_element(By.CSS_SELECTOR, "h2.question").text == logged[-1]["question"]
        assert len(article.find_elements(By.CSS_SELECTOR, "li.turn")) == len(logged[-1]["turns"]) >= 1
        driver.save_screenshot(str(tmp_path / "train.png"))
        assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
    assert (tmp_path / "train.png").read_bytes().startswith(b"\x89PNG")
