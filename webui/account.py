"""The account page's own JSON: the user's usage over time and their keys (`/ui/api/usage`, `/ui/api/keys`).

A member creates and revokes only their own keys, in their own team; the secret is in the
response that creates it and nowhere else. Limits and what is left of them come from the
public `GET /v1/key`, which the page calls with the session like any client.
"""
from __future__ import annotations

from rest_framework import serializers
from rest_framework.response import Response

from openai_api.serializers.fields import RejectUnknownFieldsMixin, StrictCharField, StrictFloatField

from . import selectors, services
from .page_api import PageAPIView


class NewKeySerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    name = StrictCharField(max_length=200)
    expires_days = StrictFloatField(min_value=0.01, max_value=3650, required=False, allow_null=True)


class UsageQuerySerializer(serializers.Serializer):
    days = serializers.IntegerField(min_value=1, max_value=366, default=30)


class UsageView(PageAPIView):
    def get(self, request):
        query = UsageQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        days = query.validated_data["days"]
        return Response({"days": days, "data": selectors.usage_per_day(request.user, days)})


class KeyListView(PageAPIView):
    def get(self, request):
        return Response({"data": [selectors.key_body(key) for key in selectors.keys_of(request.user)]})

    def post(self, request):
        serializer = NewKeySerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        key, secret = services.issue_own_key(request.user, **serializer.validated_data)
        return Response({**selectors.key_body(key), "secret": secret}, status=201)


class KeyDetailView(PageAPIView):
    def delete(self, request, key_id: int):
        services.revoke_own_key(request.user, key_id)
        return Response(status=204)
