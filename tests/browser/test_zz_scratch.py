import json, time
import pytest
from .conftest import screenshot

def test_scratch(page_of, web_server):
    page = page_of("sam", width=1280, height=800)
    page.goto(f"{web_server.base_url}/admin/catalog/cachedmodel/")
    page.wait_for_selector("#result_list")
    screenshot(page, "zz-admin-1280")
    print(page.evaluate("""() => [...document.querySelectorAll('#result_list thead th')].map(th => [th.textContent.trim(), Math.round(th.getBoundingClientRect().left), Math.round(th.getBoundingClientRect().right)])"""))
    print(page.evaluate("() => { const f = document.getElementById('changelist-filter'); return f && [f.getBoundingClientRect().left, f.getBoundingClientRect().right]; }"))
    print(page.evaluate("() => { const f = document.getElementById('nav-sidebar'); return f && [f.getBoundingClientRect().left, f.getBoundingClientRect().right, getComputedStyle(f).display]; }"))
