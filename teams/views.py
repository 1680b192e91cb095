"""`GET /v1/key`: the calling key's (or session's) team, limits and what is left of them."""
from __future__ import annotations

from adrf.views import APIView
from rest_framework.response import Response

from .quota import quota_status
from .response_headers import RateLimitHeadersMixin


class KeyStatusView(RateLimitHeadersMixin, APIView):
    async def get(self, request):
        return Response(await quota_status(request.auth))
