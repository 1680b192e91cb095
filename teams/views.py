"""`GET /v1/key`: the calling key's (or session's) team, limits and what is left of them."""
from __future__ import annotations

from adrf.views import APIView
from rest_framework.response import Response

from .quota import quota_status


class KeyStatusView(APIView):
    async def get(self, request):
        return Response(await quota_status(request.auth))
