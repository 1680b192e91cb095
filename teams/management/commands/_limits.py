"""Arguments `create_team` and `create_api_key` share."""
from __future__ import annotations


def model_list(text: str | None) -> list[str]:
    return [name.strip() for name in (text or "").split(",") if name.strip()]


def add_limit_arguments(parser) -> None:
    parser.add_argument("--models", help="comma-separated model ids it may use (default: every model)")
    parser.add_argument("--rpm", type=int, help="requests per minute")
    parser.add_argument("--tpm", type=int, help="tokens per minute (prompt + max_tokens reserved at admission)")
    parser.add_argument("--max-parallel", type=int, help="requests in flight at once")
