"""The OpenAPI 3.1 description of the API (drf-spectacular), built from the request serializers.

Views call their serializer inside `post`, so drf-spectacular cannot guess it: the extensions here
name each view's request serializer and responses, give our custom fields their JSON Schema, and
declare the bearer key. Registered on import (openai_api.apps); the view modules stay untouched.
"""
from __future__ import annotations

from drf_spectacular.extensions import (
    OpenApiAuthenticationExtension,
    OpenApiSerializerFieldExtension,
    OpenApiViewExtension,
)
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view, inline_serializer
from rest_framework import serializers

from .errors import ERROR_TYPES

STRING_ARRAY = {"type": "array", "items": {"type": "string"}}
TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}}
OBJECT = {"type": "object", "additionalProperties": True}

FIELD_SCHEMAS = {
    "openai_api.serializers.completions.PromptField": {
        "oneOf": [{"type": "string"}, {**STRING_ARRAY, "minItems": 1}, {**TOKEN_IDS, "minItems": 1},
                  {"type": "array", "items": {**TOKEN_IDS, "minItems": 1}, "minItems": 1}]},
    "openai_api.serializers.embeddings.EmbeddingInputField": {
        "oneOf": [{"type": "string", "minLength": 1}, {**STRING_ARRAY, "minItems": 1, "maxItems": 2048},
                  {**TOKEN_IDS, "minItems": 1},
                  {"type": "array", "items": {**TOKEN_IDS, "minItems": 1}, "minItems": 1, "maxItems": 2048}]},
    "openai_api.serializers.score.ScoreInputField": {
        "oneOf": [{"type": "string", "minLength": 1},
                  {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 2048}]},
    "openai_api.serializers.fields.StopField": {"oneOf": [{"type": "string"}, {**STRING_ARRAY, "maxItems": 16}]},
    "openai_api.serializers.fields.LogitBiasField": {
        "type": "object", "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
        "description": 'token id (as a string of ASCII digits) -> bias, e.g. {"50256": -100}'},
    "openai_api.serializers.conversation.MessagesField": {"type": "array", "items": OBJECT, "minItems": 1},
    "openai_api.serializers.conversation.ToolsField": {"type": "array", "items": OBJECT, "maxItems": 128},
    "openai_api.serializers.chat.ToolChoiceField": {
        "oneOf": [{"type": "string", "enum": ["none", "auto", "required"]}, OBJECT]},
    "openai_api.serializers.structured.ResponseFormatField": OBJECT,
    "openai_api.serializers.conversation.TemplateKwargsField": OBJECT,
    "openai_api.serializers.fields.StringListField": {**STRING_ARRAY, "maxItems": 64},
    "openai_api.serializers.fields.TokenSequencesField": {"type": "array", "items": {**TOKEN_IDS, "minItems": 1},
                                                          "maxItems": 256},
    "openai_api.serializers.fields.EarlyStoppingField": {"oneOf": [{"type": "boolean"},
                                                                   {"type": "string", "enum": ["never"]}]},
    "openai_api.serializers.openai_params.ObjectField": OBJECT,
    "openai_api.serializers.openai_params.MetadataField": {
        "type": "object", "maxProperties": 16, "additionalProperties": {"type": "string", "maxLength": 512}},
    "openai_api.serializers.openai_params.ModalitiesField": {"type": "array", "items": {"type": "string",
                                                                                        "enum": ["text"]}},
    "openai_api.serializers.chat.DocumentsField": {"type": "array", "items": OBJECT, "maxItems": 256},
    "openai_api.serializers.fields.TokenIdsField": TOKEN_IDS,
    "openai_api.serializers.structured.StructuredOutputsField": {
        "type": "object", "minProperties": 1, "maxProperties": 4, "additionalProperties": False,
        "description": "exactly one of json (a JSON Schema), regex, choice (strings) or grammar (Lark/GBNF text)",
        "properties": {"json": {"oneOf": [OBJECT, {"type": "string"}]}, "regex": {"type": "string"},
                       "choice": {**STRING_ARRAY, "minItems": 1}, "grammar": {"type": "string"}}},
}


def _field_extension(target: str, schema: dict) -> type:
    return type(target.rsplit(".", 1)[1] + "Schema", (OpenApiSerializerFieldExtension,), {
        "target_class": target,
        "map_serializer_field": lambda self, auto_schema, direction: schema,
    })


FIELD_EXTENSIONS = [_field_extension(target, schema) for target, schema in FIELD_SCHEMAS.items()]


class BearerKeyScheme(OpenApiAuthenticationExtension):
    target_class = "teams.authentication.BearerKeyAuthentication"
    name = "bearer"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "an API key: `Authorization: Bearer <key>`"}


class SessionCookieScheme(OpenApiAuthenticationExtension):
    target_class = "teams.authentication.SessionPrincipalAuthentication"
    name = "session"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "cookie", "name": "sessionid",
                "description": "our own pages: a logged-in user's session cookie, with `X-CSRFToken` on writes"}


ERROR_BODY = inline_serializer("ErrorResponse", {"error": inline_serializer("Error", {
    "message": serializers.CharField(),
    "type": serializers.ChoiceField(choices=sorted(set(ERROR_TYPES.values()))),
    "param": serializers.CharField(allow_null=True),
    "code": serializers.CharField(allow_null=True),
})})
ERRORS = {status: OpenApiResponse(ERROR_BODY, description="an OpenAI-shaped error")
          for status in (400, 401, 403, 404, 405, 409, 413, 415, 429, 431, 500, 503)}


def responses(streams: bool, media_type: str = "application/json", text_types: tuple[str, ...] = ()) -> dict:
    """200 as an object (and an SSE stream where `stream: true` is allowed, or text in `text_types`),
    every error in OpenAI's shape."""
    # An SSE-only answer (TGI's /generate_stream): each event an object (schemathesis checks events so).
    ok = {(200, media_type): OpenApiTypes.OBJECT if media_type in ("application/json", "text/event-stream")
          else OpenApiTypes.STR}
    ok.update({(200, text_type): OpenApiTypes.STR for text_type in text_types})
    if streams:
        ok[(200, "text/event-stream")] = OpenApiTypes.STR
    return {**ok, **{(status, "application/json"): error for status, error in ERRORS.items()}}


def _view_extension(target: str, method: str, request: str | None, streams: bool, summary: str,
                    media_type: str = "application/json", text_types: tuple[str, ...] = (),
                    also: dict[str, str] | None = None) -> type:
    """`also`: more methods of the same view, each with its summary (no request body, a JSON answer)."""
    def view_replacement(self):
        serializer = _serializer(request) if request else None
        schemas = {method: extend_schema(request=serializer, responses=responses(streams, media_type, text_types),
                                         summary=summary, operation_id=_operation_id(summary))}
        for other, other_summary in (also or {}).items():
            schemas[other] = extend_schema(request=None, responses=responses(False), summary=other_summary,
                                           operation_id=_operation_id(other_summary))
        # A subclass: extend_schema_view wraps inherited handlers in plain (sync) functions, which on
        # the served class itself would turn the async views sync.
        documented = type(self.target_class.__name__, (self.target_class,), {"__module__": __name__})
        return extend_schema_view(**schemas)(documented)

    return type(target.rsplit(".", 1)[1] + "Schema", (OpenApiViewExtension,),
                {"target_class": target, "view_replacement": view_replacement})


def _operation_id(summary: str) -> str:
    return summary.lower().replace(" ", "_").replace("/", "")


def _serializer(dotted: str):
    from importlib import import_module

    module, name = dotted.rsplit(".", 1)
    return getattr(import_module(module), name)


SERIALIZERS = "openai_api.serializers."
VIEW_EXTENSIONS = [
    _view_extension("openai_api.completions.CompletionsView", "post",
                    SERIALIZERS + "completions.CompletionRequestSerializer",
                    True, "Create completion"),
    _view_extension("openai_api.chat.ChatCompletionsView", "post", SERIALIZERS + "chat.ChatRequestSerializer",
                    True, "Create chat completion"),
    _view_extension("openai_api.embeddings.EmbeddingsView", "post", SERIALIZERS + "embeddings.EmbeddingRequestSerializer",
                    False, "Create embeddings"),
    _view_extension("openai_api.score.RerankView", "post", SERIALIZERS + "score.RerankRequestSerializer",
                    False, "Rerank"),
    _view_extension("openai_api.score.RerankAliasView", "post", SERIALIZERS + "score.RerankRequestSerializer",
                    False, "Rerank alias"),
    _view_extension("openai_api.score.RerankV2View", "post", SERIALIZERS + "score.RerankRequestSerializer",
                    False, "Rerank v2"),
    _view_extension("openai_api.score.ScoreView", "post", SERIALIZERS + "score.ScoreRequestSerializer",
                    False, "Score"),
    _view_extension("openai_api.score.ScoreAliasView", "post", SERIALIZERS + "score.ScoreRequestSerializer",
                    False, "Score alias"),
    _view_extension("openai_api.tgi.TGIGenerateView", "post", SERIALIZERS + "tgi.TGIRequestSerializer",
                    False, "TGI generate"),
    _view_extension("openai_api.tgi.TGIStreamView", "post", SERIALIZERS + "tgi.TGIRequestSerializer",
                    False, "TGI generate stream", "text/event-stream"),
    _view_extension("openai_api.tgi.TGIInfoView", "get", None, False, "TGI info"),
    _view_extension("openai_api.response_views.ResponsesView", "post", SERIALIZERS + "responses.ResponsesRequestSerializer",
                    True, "Create response"),
    _view_extension("openai_api.response_views.StoredResponseView", "get", None, False, "Retrieve response",
                    also={"delete": "Delete response"}),
    _view_extension("openai_api.response_views.CancelResponseView", "post", None, False, "Cancel response"),
    _view_extension("openai_api.response_views.InputItemsView", "get", None, False, "List input items"),
    _view_extension("openai_api.server_info.VersionView", "get", None, False, "Version"),
    _view_extension("openai_api.server_info.TokenizerInfoView", "get", None, False, "Tokenizer info"),
    _view_extension("openai_api.tokenization.TokenizeView", "post", SERIALIZERS + "tokenize.TokenizeRequestSerializer",
                    False, "Tokenize"),
    _view_extension("openai_api.tokenization.DetokenizeView", "post",
                    SERIALIZERS + "tokenize.DetokenizeRequestSerializer",
                    False, "Detokenize"),
    _view_extension("openai_api.model_loading.LoadModelView", "post", SERIALIZERS + "model_loading.ModelNameSerializer",
                    True, "Load model"),
    _view_extension("openai_api.model_loading.UnloadModelView", "post",
                    SERIALIZERS + "model_loading.ModelNameSerializer",
                    False, "Unload model"),
    _view_extension("openai_api.model_list.ModelListView", "get", None, False, "List models"),
    _view_extension("openai_api.model_list.ModelDetailView", "get", None, False, "Retrieve model"),
    _view_extension("openai_api.metrics.MetricsView", "get", None, False, "Metrics", "text/plain"),
    _view_extension("teams.views.KeyStatusView", "get", None, False, "Key status"),
    _view_extension("openai_api.audio.TranscriptionsView", "post", SERIALIZERS + "audio.TranscriptionRequestSerializer",
                    True, "Create transcription", text_types=("text/plain", "application/x-subrip", "text/vtt")),
    _view_extension("openai_api.audio.TranslationsView", "post", SERIALIZERS + "audio.TranslationRequestSerializer",
                    False, "Create translation", text_types=("text/plain", "application/x-subrip", "text/vtt")),
]
