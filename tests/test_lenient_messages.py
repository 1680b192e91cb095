"""Chat messages as clients really send them (issue 49): fields we do not know are ignored (a debug line says
so), a role of the client's own goes to the chat template, and only what the template rejects is a 400."""
from __future__ import annotations

import httpx
import openai
import pytest

from tests.conftest import TINY_MODEL
from tests.live_server import LiveServer, base_env
from workers.tiny.builders import CHAT_TEMPLATE_PATH

# The tiny model's own template, refusing one role the way templates refuse things (raise_exception).
REFUSING_TEMPLATE = ("{%- for m in messages %}{%- if m.role == 'forbidden' %}"
                     "{{ raise_exception('this template takes no forbidden role') }}{%- endif %}{%- endfor %}"
                     + CHAT_TEMPLATE_PATH.read_text())
EXTRAS = {"cache_control": {"type": "ephemeral"}, "x_vendor": {"trace": "abc"}}


@pytest.fixture(scope="module")
def lenient_server(hf_cache, tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("lenient")
    template = work_dir / "refusing.jinja"
    template.write_text(REFUSING_TEMPLATE)
    live = LiveServer(base_env(hf_cache, work_dir), work_dir, name="lenient",
                      extra_args=("--log-level", "debug", "--chat-template", str(template)))
    yield live
    live.stop()


def sdk(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=server.key, max_retries=0, timeout=120)


def rendered(server: LiveServer, messages: list[dict]) -> list[int]:
    response = httpx.post(f"{server.base_url}/tokenize", headers=server.headers, timeout=60,
                          json={"model": TINY_MODEL, "messages": messages})
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def test_unknown_message_and_part_fields_are_ignored(lenient_server):
    plain = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello", "name": "ann"}]
    decorated = [{"role": "system", "content": "Be brief.", **EXTRAS},
                 {"role": "user", "content": [{"type": "text", "text": "Hello", **EXTRAS}], "name": "ann"}]
    chat = sdk(lenient_server).chat.completions.create(model=TINY_MODEL, messages=decorated, max_tokens=4,
                                                        temperature=0)
    same = sdk(lenient_server).chat.completions.create(model=TINY_MODEL, messages=plain, max_tokens=4,
                                                       temperature=0)
    assert chat.choices[0].message.content == same.choices[0].message.content
    assert chat.usage.prompt_tokens == same.usage.prompt_tokens
    assert rendered(lenient_server, decorated) == rendered(lenient_server, plain)
    lenient_server.wait_for_log("ignoring fields the server does not know: cache_control, x_vendor", timeout=10)


def test_a_custom_role_goes_to_the_template(lenient_server):
    messages = [{"role": "my-custom-role", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    chat = sdk(lenient_server).chat.completions.create(model=TINY_MODEL, messages=messages, max_tokens=4)
    assert chat.choices[0].finish_reason in ("stop", "length")
    as_system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    custom_ids, system_ids = rendered(lenient_server, messages), rendered(lenient_server, as_system)
    assert custom_ids != system_ids  # the role's own name is in the prompt, not a system turn in its place
    assert chat.usage.prompt_tokens == len(custom_ids)


def test_only_what_the_template_rejects_is_refused(lenient_server):
    with pytest.raises(openai.BadRequestError) as refused:
        sdk(lenient_server).chat.completions.create(model=TINY_MODEL, max_tokens=4, messages=[
            {"role": "forbidden", "content": "x"}, {"role": "user", "content": "Hello"}])
    assert refused.value.code == "chat_template_error"
    assert "forbidden role" in refused.value.message
    with pytest.raises(openai.BadRequestError) as not_a_role:
        sdk(lenient_server).chat.completions.create(model=TINY_MODEL, max_tokens=4, messages=[
            {"role": "not a role!", "content": "x"}])
    assert not_a_role.value.param == "messages[0].role"
