"""OpenAI's error shape, checked the same way by every test that sends bad input."""
from __future__ import annotations



def assert_openai_error(response, status: int, param=None, code=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert "Traceback" not in response.text
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error
