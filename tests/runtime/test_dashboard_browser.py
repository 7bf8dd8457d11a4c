"""The Ray dashboard as a person sees it in a browser: locked without the token, the run's
member actors listed once signed in.

Signing in is what the dashboard's own login does: the token in the cookie
``ray-authentication-token``. The token comes from ``ray get-auth-token`` and goes only
into the browser; it is never printed. ``POPGRPO_SCREENSHOT_DIR=docs/img`` keeps the
screenshot (the picture in docs/guides/watch.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from popgrpo.config import load_config, preset_path
from popgrpo.runtime.ray_executor import RayExecutor

pytestmark = [pytest.mark.ray, pytest.mark.heavy]


def _token() -> str:
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    done = subprocess.run([ray_bin, "get-auth-token"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, "ray get-auth-token failed"  # its output may hold the token: not shown
    return done.stdout.strip()


@pytest.mark.requires("chromium")
def test_dashboard_lists_the_runs_actors_once_signed_in(ray_local, tmp_path):
    from tests.browser import Chromium

    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        pytest.fail("the test Ray should run with token authentication on (Ray's default)")
    url = ray_local.ctx.dashboard_url
    url = url if "://" in url else f"http://{url}"
    out = Path(os.environ.get("POPGRPO_SCREENSHOT_DIR") or tmp_path)
    cfg = load_config(
        preset_path("pop_grpo"),
        ["population.size=4", "population.members_per_actor=2", "run.epochs=2", "grpo.steps_per_epoch=1"],
    )
    executor = RayExecutor(cfg, run_dir=tmp_path / "watched-run")
    browser = Chromium(width=1280, height=720)
    try:
        # What a new user sees first.
        browser.capture(f"{url}/#/actors", expect=["Authentication Token Required"], settle_s=0)
        cookie = {"name": "ray-authentication-token", "value": _token(), "url": url, "httpOnly": True}
        text = browser.capture(
            f"{url}/#/actors", expect=["MemberGroup", "ALIVE"], png=out / "ray_dashboard_actors.png", cookies=[cookie]
        )
        assert "Authentication Token Required" not in text
        assert text.count("MemberGroup") >= 2  # population.size 4, two members per actor
    finally:
        browser.stop()
        executor.close()


@pytest.mark.requires("chromium")
def test_the_actors_page_finds_every_member_of_a_running_population_by_its_name(ray_local, tmp_path):
    """A person types the run's name into the Actors page's Name filter while the population
    trains, and finds each member actor (and the archive and evaluator actors) by its name, with what it said
    about itself when it started in the Repr column. The screenshot is the one in
    docs/guides/watch.md (``POPGRPO_SCREENSHOT_DIR=docs/img``)."""
    import threading

    from tests.browser import Chromium

    url = ray_local.ctx.dashboard_url
    url = url if "://" in url else f"http://{url}"
    out = Path(os.environ.get("POPGRPO_SCREENSHOT_DIR") or tmp_path)
    cfg = load_config(
        preset_path("pop_grpo"),
        [
            "population.size=4",
            "population.resources.num_cpus=0.5",
            "archive.shared=true",
            "run.epochs=40",
            "scheduler.interval_epochs=10",
            "grpo.steps_per_epoch=4",
        ],
    )
    run = "pop_grpo-20261125-172500"  # a run directory's name, as popgrpo train makes it
    executor = RayExecutor(cfg, run_dir=tmp_path / run)
    training = threading.Thread(target=executor.train, args=(10, 0))  # a round runs while we look
    browser = Chromium(width=1920, height=860)
    try:
        executor.round0_weights([0])  # the evaluator actor, started with the members, has answered
        training.start()
        names = [f"{run}/member-{k}" for k in range(4)] + [f"{run}/archive", f"{run}/evaluator"]
        cookie = {"name": "ray-authentication-token", "value": _token(), "url": url, "httpOnly": True}
        text = browser.capture(
            f"{url}/#/actors",
            expect=[*names, "ALIVE"],
            type_into={"Name": run},
            png=out / "ray_dashboard_actors_named.png",
            cookies=[cookie],
        )
        assert all(text.count(name) >= 1 for name in names)
        assert "TOTAL\nx 6\nALIVE\nx 6" in text  # the filter keeps this run's six actors, all alive
        assert all(f"member-{k} [cpu] new" in text for k in range(4))  # Repr: read at start
        assert "archive: 1 shared archive, new" in text
        assert "evaluator: held-out evaluation and θ_0 at a round's end" in text
    finally:
        training.join(timeout=600)
        browser.stop()
        executor.close()


def test_the_printed_dashboard_line_is_the_connected_clusters_and_locked(ray_local):
    """What ``popgrpo train`` prints once connected: this cluster's dashboard, which refuses a
    request without the token, and where the token is, never the token itself."""
    import urllib.error
    import urllib.request

    from popgrpo.telemetry.watching import watch_lines

    [line] = watch_lines(None, None, ray_connected=True)
    url = ray_local.ctx.dashboard_url
    url = url if "://" in url else f"http://{url}"
    assert line.startswith(f"Ray dashboard: {url} (token auth is on")
    assert "ray get-auth-token" in line and _token() not in line
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{url}/api/version", timeout=10)
    assert refused.value.code == 401
