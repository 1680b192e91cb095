"""The page's conversation store: `/ui/api/conversations[/<id>]`, JSON, session cookie + CSRF only."""
from __future__ import annotations

from rest_framework.response import Response

from . import selectors, services
from .page_api import PageAPIView
from .serializers import ConversationSerializer, ConversationSettingsSerializer, TurnsSerializer, conversation_body


class ConversationListView(PageAPIView):
    def get(self, request):
        return Response({"data": [conversation_body(c, with_messages=False)
                                  for c in selectors.conversations_of(request.user)]})

    def post(self, request):
        serializer = ConversationSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        conversation = services.create_conversation(request.user, serializer.validated_data)
        return Response(conversation_body(conversation), status=201)


class ConversationDetailView(PageAPIView):
    def get(self, request, conversation_id: int):
        return Response(conversation_body(selectors.conversation_of(request.user, conversation_id)))

    def patch(self, request, conversation_id: int):
        conversation = selectors.conversation_of(request.user, conversation_id)
        serializer = ConversationSettingsSerializer(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        return Response(conversation_body(services.update_settings(conversation, serializer.validated_data)))

    def delete(self, request, conversation_id: int):
        services.delete_conversation(selectors.conversation_of(request.user, conversation_id))
        return Response(status=204)


class TurnsView(PageAPIView):
    """`POST /ui/api/conversations/<id>/turns`: a turn appended (or a tail replaced), version-checked."""

    def post(self, request, conversation_id: int):
        serializer = TurnsSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        conversation = services.write_turns(conversation_id, request.user, **serializer.validated_data)
        return Response({"id": conversation.id, "version": conversation.version,
                         "length": len(conversation.messages), "updated_at": conversation.updated_at.isoformat()})
