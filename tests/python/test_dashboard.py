"""The dashboard in a real browser: Debian's chromium, headless, driven through chromium-driver
by selenium, against a real cluster. The pages load with no console errors, a running job
appears and its curves gain points as validations happen, Cancel cancels it, text a user wrote
renders as text, and a wrong token is refused. Screenshots of the cluster, jobs and job pages
go to $DTRAIN_SCREENSHOTS (ctest sets build/screenshots)."""

import os
import tempfile
import time

import pytest
from selenium import webdriver
from selenium.common.exceptions import (NoAlertPresentException, NoSuchElementException,
                                        StaleElementReferenceException)
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

import dtrain
from conftest import Cluster
from dtrain.v1 import jobs_pb2

XSS = "<img src=x onerror=alert(1)>"


def synthetic(name, epochs, train_size=4096):
    return {
        "name": name,
        "model": {"builtin": "mlp"},
        "data": {"synthetic": {"train_size": train_size, "val_size": 128, "test_size": 128,
                               "seed": 3}, "batch_size": 32},
        "trainer": {"max_epochs": epochs, "num_nodes": 2, "strategy": "ddp",
                    "val_check_interval": 0.1},
        "seed_everything": 1,
        "optimizer": {"name": "sgd", "lr": 0.05},
    }


@pytest.fixture(scope="module")
def browser():
    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1400,1100"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver):
    """The SEVERE entries of the browser's console since the last call."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def shoot(driver, name):
    directory = os.environ.get("DTRAIN_SCREENSHOTS", tempfile.gettempdir())
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    assert driver.save_screenshot(path), path
    return path


def wait_for(driver, condition, seconds=30, what="the page"):
    # Live views redraw their parts: an element found a moment ago may be gone (stale).
    return WebDriverWait(driver, seconds, poll_frequency=0.1,
                         ignored_exceptions=(NoSuchElementException,
                                             StaleElementReferenceException)).until(
        lambda d: condition(d), message=f"{what} did not appear within {seconds} s")


def text_of(driver, selector):
    """The text of the element `selector` names, read again if it was redrawn meanwhile."""
    return wait_for(driver, lambda d: d.find_element(By.CSS_SELECTOR, selector).text or " ",
                    what=selector)


def points(driver, family, label):
    """How many points the chart of `family` shows for the dataset `label`."""
    return driver.execute_script(
        "const c = document.querySelector(`canvas[data-family='${arguments[0]}']`);"
        "if (!c) return 0; const chart = Chart.getChart(c); if (!chart) return 0;"
        "const d = chart.data.datasets.find(d => d.label === arguments[1]);"
        "return d ? d.data.length : 0;", family, label)


def test_cluster_jobs_and_job_pages_live_cancel_and_escaping(cluster, browser):
    client = dtrain.Client(cluster.address)
    job = client.submit(synthetic("shown", epochs=1000))
    deadline = time.monotonic() + 60
    while job.status().state != jobs_pb2.RUNNING:
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.1)

    # The cluster: both workers, the running job counted.
    browser.get(cluster.url)
    wait_for(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#workers tr")) == 3,
             what="the workers table")
    table = text_of(browser, "#workers")
    assert "w0" in table and "w1" in table and "ALIVE" in table
    wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#count-RUNNING .value").text == "1",
             what="one running job")
    shoot(browser, "cluster.png")
    assert console_errors(browser) == []

    # The jobs table: the job is there, and its progress moves without a reload.
    browser.get(cluster.url + "#/jobs")
    row = f"#jobs tr[data-job='{job.id}']"
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, row), what="the job's row")
    first = text_of(browser, row)
    assert "RUNNING" in first and "shown" in first
    wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, row).text != first,
             what="a live update of the row")
    shoot(browser, "jobs.png")
    assert console_errors(browser) == []

    # One job: its curves gain points as validations happen; train and validation loss share
    # the loss chart.
    browser.get(cluster.url + f"#/jobs/{job.id}")
    wait_for(browser, lambda d: points(d, "loss", "val_loss") >= 1, seconds=60,
             what="a first validation point")
    before = points(browser, "loss", "val_loss")
    wait_for(browser, lambda d: points(d, "loss", "val_loss") > before, seconds=60,
             what="more validation points")
    assert points(browser, "loss", "train_loss") > 0, "train_loss on the same axes"
    assert "group formed" in text_of(browser, "#log")
    assert '"strategy": "ddp"' in text_of(browser, "#spec")
    # Which plane the collectives use (auto: both workers here, so shared memory), and where
    # the seconds went so far.
    assert text_of(browser, "#plane") == "collectives over shm"
    assert "train " in text_of(browser, "#phases")
    shoot(browser, "job.png")
    assert console_errors(browser) == []

    # Cancel cancels it.
    wait_for(browser, lambda d: d.find_element(By.ID, "cancel").click() or True, what="Cancel")
    wait_for(browser, lambda d: "CANCELLED" in d.find_element(By.ID, "job-title").find_element(
        By.XPATH, "..").text, seconds=30, what="the cancelled state")
    assert job.status().state == jobs_pb2.CANCELLED
    assert browser.find_elements(By.ID, "cancel") == [], "an ended job offers no Cancel"
    # Accuracy on an axis from 0 to 1; loss on an axis fitted to its data.
    scales = browser.execute_script(
        "return ['acc', 'loss'].map(f => { const c = document.querySelector("
        "`canvas[data-family='${f}']`); const chart = c && Chart.getChart(c);"
        "return chart ? [chart.scales.y.min, chart.scales.y.max,"
        "                chart.options.scales.y.max === undefined] : null; });")
    assert scales[0] == [0, 1, False], scales
    assert scales[1] is not None and scales[1][2], scales
    # LearningRateMonitor's per-group rates share their optimizer's chart.
    assert browser.execute_script(
        "return ['lr-AdamW/pg1', 'lr-AdamW/pg2', 'lr-SGD', 'train_acc_step'].map(family);") == [
        "lr-AdamW", "lr-AdamW", "lr-SGD", "acc"]
    assert console_errors(browser) == []

    # What a user wrote is shown as text: a job name with markup is refused at submission, and
    # a path with markup, which lands in the job's reason and log, is escaped there.
    with pytest.raises(dtrain.InvalidArgument):
        client.submit(dict(synthetic("x", 1), name=XSS))
    broken = synthetic("escaped", 1)
    broken["model"] = {"torchscript": f"worker:/nonexistent/{XSS}.pt"}
    failed = client.submit(broken)
    with pytest.raises(dtrain.JobFailed):
        failed.wait(timeout=120)
    browser.get(cluster.url + f"#/jobs/{failed.id}")
    wait_for(browser, lambda d: d.find_elements(By.ID, "reason"), what="the failure reason")
    reason = text_of(browser, "#reason")
    assert XSS in reason, reason
    assert browser.find_elements(By.CSS_SELECTOR, "#reason img, #log img, #spec img") == []
    wait_for(browser, lambda d: XSS in d.find_element(By.ID, "log").text, what="the log")
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text
    shoot(browser, "job-failed.png")
    assert console_errors(browser) == []


def test_wrong_token_refused_right_token_logs_in(browser, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("dashboard-token-42\n")
    with tempfile.TemporaryDirectory(prefix="dtrain-web-") as directory:
        c = Cluster(directory, workers=0, coordinator_flags=[f"--token_file={token_file}"])
        try:
            browser.delete_all_cookies()
            browser.get(c.url)
            wait_for(browser, lambda d: d.find_elements(By.ID, "token"), what="the login page")
            browser.find_element(By.ID, "token").send_keys("not-the-token")
            browser.find_element(By.CSS_SELECTOR, "#login button").click()
            error = wait_for(browser, lambda d: d.find_element(By.ID, "login-error")
                             if d.find_element(By.ID, "login-error").is_displayed() else None,
                             what="the refusal")
            assert "wrong token" in error.text
            assert browser.find_elements(By.ID, "main") == [], "still the login page"
            shoot(browser, "login-refused.png")
            browser.find_element(By.ID, "token").clear()
            browser.find_element(By.ID, "token").send_keys("dashboard-token-42")
            browser.find_element(By.CSS_SELECTOR, "#login button").click()
            wait_for(browser, lambda d: d.find_elements(By.ID, "workers"), what="the cluster page")
            cookie = browser.get_cookie("dtrain_session")
            assert cookie and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
            # The refused attempts logged their 401s; a logged-in page logs nothing.
            console_errors(browser)
            browser.refresh()
            wait_for(browser, lambda d: d.find_elements(By.ID, "workers"), what="the cluster page")
            assert console_errors(browser) == []
        finally:
            c.stop()
