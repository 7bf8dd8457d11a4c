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

pytestmark = pytest.mark.ray


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
