"""What the pages' own JSON endpoints share: a logged-in user's session, and no place in /openapi.json."""
from __future__ import annotations

from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import IsAuthenticated
from rest_framework.views import APIView


class PageAPIView(APIView):
    schema = None  # the pages' own JSON, not part of the public API (left out of /openapi.json)
    authentication_classes = [SessionAuthentication]
    permission_classes = [IsAuthenticated]
