"""The admin against a live server: its actions reach the running worker, and settings survive a restart."""
from __future__ import annotations

import re

import httpx
import pytest

from .live_server import LiveServer
from .helpers.catalog import catalog_cache, catalog_env, complete, listed, manage, wait_until  # noqa: F401

CHANGELIST = "/admin/catalog/cachedmodel/"


class AdminSession:
    """A logged-in staff browser: session cookie plus the CSRF token every POST carries."""

    def __init__(self, server: LiveServer, username: str, password: str) -> None:
        self.http = httpx.Client(base_url=server.base_url, timeout=30, follow_redirects=True)
        self.http.get("/admin/login/")
        response = self.http.post("/admin/login/?next=/admin/", data={
            "username": username, "password": password, "csrfmiddlewaretoken": self.http.cookies["csrftoken"]})
        assert response.status_code == 200 and "Log out" in response.text, response.text[:500]

    def pk(self, repo_id: str) -> str:
        page = self.http.get(CHANGELIST).text
        return re.search(rf'href="{CHANGELIST}(\d+)/change/[^"]*">{re.escape(repo_id)}<', page).group(1)

    def action(self, name: str, repo_id: str, **fields: str) -> str:
        data = {"action": name, "_selected_action": self.pk(repo_id),
                "csrfmiddlewaretoken": self.http.cookies["csrftoken"], **fields}
        response = self.http.post(CHANGELIST, data=data)
        assert response.status_code == 200
        return response.text


@pytest.fixture
def admin_env(catalog_cache, tmp_path):  # noqa: F811
    env = catalog_env(catalog_cache, tmp_path, DJANGO_SUPERUSER_USERNAME="root", DJANGO_SUPERUSER_PASSWORD="pw-123",
                      DJANGO_SUPERUSER_EMAIL="root@example.com")
    manage(env, "migrate", "--verbosity", "0")
    manage(env, "createsuperuser", "--noinput")
    return env


def test_admin_actions_act_on_the_live_worker_and_settings_survive_a_restart(admin_env, tmp_path):
    server = LiveServer(admin_env, tmp_path)
    try:
        admin = AdminSession(server, "root", "pw-123")
        assert "Asked any worker to load local/other" in admin.action("preload_now", "local/other")
        wait_until(lambda: listed(server)["local/other"]["status"] == "loaded", what="admin preload")
        events = admin.http.get("/admin/catalog/loadevent/").text
        assert "admin:root" in events and "local/other@main" in events

        # A new idle timeout reaches the running worker: the model goes without a restart.
        page = admin.action("set_idle_timeout", "local/other")
        assert 'name="idle_timeout"' in page
        admin.action("set_idle_timeout", "local/other", apply="1", idle_timeout="1")
        server.wait_for_log("unloaded local/other@main (idle)", timeout=15)

        admin.action("disable", "local/third")
        assert complete(server, "local/third").status_code == 404
        assert "local/third" not in listed(server)
        workers = admin.http.get("/admin/catalog/worker/").text
        assert "online" in workers
    finally:
        server.stop()

    restarted = LiveServer(admin_env, tmp_path, name="restarted")
    try:
        assert "local/third" not in listed(restarted)
        assert complete(restarted, "local/third").status_code == 404
        out = manage(admin_env, "shell", "-c", "from catalog.models import CachedModel as M; "
                                               "print(M.objects.get(repo_id='local/other').idle_timeout)")
        assert out.strip().splitlines()[-1] == "1"
        assert complete(restarted, "local/other").status_code == 200
        restarted.wait_for_log("unloaded local/other@main (idle)", timeout=15)  # the setting still applies
    finally:
        restarted.stop()
