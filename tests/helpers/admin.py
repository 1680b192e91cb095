"""A browser-less admin session (a superuser logged in through /admin/login/)."""
from __future__ import annotations

import httpx

from ..live_server import LiveServer
from ..teams_setup import manage


def admin_client(live: LiveServer) -> httpx.Client:
    env = {**live.env, "DJANGO_SUPERUSER_USERNAME": "root", "DJANGO_SUPERUSER_PASSWORD": "pw-123",
           "DJANGO_SUPERUSER_EMAIL": "root@example.com"}
    manage(env, "createsuperuser", "--noinput", check=False)  # already there on a second call
    http = httpx.Client(base_url=live.base_url, timeout=60, follow_redirects=True)
    http.get("/admin/login/")
    page = http.post("/admin/login/?next=/admin/", data={
        "username": "root", "password": "pw-123", "csrfmiddlewaretoken": http.cookies["csrftoken"]})
    assert "Log out" in page.text
    return http
