"""The Files and Batch APIs in /openapi.json (drf-spectacular): requests, OpenAI's `file` and `batch`
objects, the multipart upload and the binary content. Registered on import (openai_api.apps).

The serializers here only describe what views.py sends (files.file_object, service.batch_object,
files.list_body); `tests/test_openapi.py` has Schemathesis check every answer against them.
"""
from __future__ import annotations

from drf_spectacular.extensions import OpenApiViewExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers

from ..schema import ERRORS


class FileUploadSerializer(serializers.Serializer):
    file = serializers.FileField(help_text="the JSONL file, one request a line")
    purpose = serializers.ChoiceField(choices=["batch"])


class FileObjectSerializer(serializers.Serializer):
    id = serializers.CharField()
    object = serializers.CharField(help_text="always `file`")
    bytes = serializers.IntegerField(min_value=0)
    created_at = serializers.IntegerField()
    expires_at = serializers.IntegerField(allow_null=True)
    filename = serializers.CharField()
    purpose = serializers.CharField(help_text="`batch` (uploaded) or `batch_output` (an output or error file)")
    status = serializers.CharField()
    status_details = serializers.CharField(allow_null=True)


class FileListResponseSerializer(serializers.Serializer):
    object = serializers.CharField(help_text="always `list`")
    data = FileObjectSerializer(many=True)
    first_id = serializers.CharField(allow_null=True)
    last_id = serializers.CharField(allow_null=True)
    has_more = serializers.BooleanField()


class FileDeletedSerializer(serializers.Serializer):
    id = serializers.CharField()
    object = serializers.CharField(help_text="always `file`")
    deleted = serializers.BooleanField()


class BatchErrorSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    param = serializers.CharField(allow_null=True)
    line = serializers.IntegerField(allow_null=True)


class BatchErrorsSerializer(serializers.Serializer):
    object = serializers.CharField(help_text="always `list`")
    data = BatchErrorSerializer(many=True)


class RequestCountsSerializer(serializers.Serializer):
    total = serializers.IntegerField(min_value=0)
    completed = serializers.IntegerField(min_value=0)
    failed = serializers.IntegerField(min_value=0)


BATCH_STATUSES = ["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling",
                  "cancelled"]


class BatchObjectSerializer(serializers.Serializer):
    id = serializers.CharField()
    object = serializers.CharField(help_text="always `batch`")
    endpoint = serializers.CharField()
    errors = BatchErrorsSerializer(allow_null=True)
    input_file_id = serializers.CharField(allow_null=True)
    completion_window = serializers.CharField()
    status = serializers.ChoiceField(choices=BATCH_STATUSES)
    output_file_id = serializers.CharField(allow_null=True)
    error_file_id = serializers.CharField(allow_null=True)
    created_at = serializers.IntegerField()
    expires_at = serializers.IntegerField(allow_null=True)
    request_counts = RequestCountsSerializer()
    in_progress_at = serializers.IntegerField(allow_null=True)
    finalizing_at = serializers.IntegerField(allow_null=True)
    completed_at = serializers.IntegerField(allow_null=True)
    failed_at = serializers.IntegerField(allow_null=True)
    expired_at = serializers.IntegerField(allow_null=True)
    cancelling_at = serializers.IntegerField(allow_null=True)
    cancelled_at = serializers.IntegerField(allow_null=True)
    metadata = serializers.DictField(child=serializers.CharField(), allow_null=True)


class BatchListResponseSerializer(serializers.Serializer):
    object = serializers.CharField(help_text="always `list`")
    data = BatchObjectSerializer(many=True)
    first_id = serializers.CharField(allow_null=True)
    last_id = serializers.CharField(allow_null=True)
    has_more = serializers.BooleanField()


def answers(ok, media_type: str = "application/json") -> dict:
    return {(200, media_type): ok, **{(status, "application/json"): error for status, error in ERRORS.items()}}


def _operation(summary: str, ok, media_type: str = "application/json", **more):
    return extend_schema(summary=summary, operation_id=summary.lower().replace(" ", "_"),
                         responses=answers(ok, media_type), **more)


def _schemas() -> dict[str, dict]:
    from . import views

    return {
        "FilesView": {
            "get": _operation("List files", FileListResponseSerializer, request=None,
                              parameters=[views.FileListSerializer],
                              description="The team's files, newest first unless `order=asc`."),
            "post": _operation("Upload file", FileObjectSerializer,
                               request={"multipart/form-data": FileUploadSerializer},
                               description="A JSONL file of batch requests (`purpose: batch`), at most "
                                           "INFERENCE_BATCH_FILE_MAX_BYTES (413 beyond)."),
        },
        "FileDetailView": {
            "get": _operation("Retrieve file", FileObjectSerializer, request=None),
            "delete": _operation("Delete file", FileDeletedSerializer, request=None,
                                 description="The row and its bytes."),
        },
        "FileContentView": {
            "get": _operation("Retrieve file content", OpenApiTypes.STR, "application/jsonl", request=None,
                              description="The file's bytes: an upload as sent, or a batch's output or error "
                                          "file (one JSON object a line)."),
        },
        "BatchesView": {
            "get": _operation("List batches", BatchListResponseSerializer, request=None,
                              parameters=[views.PageSerializer],
                              description="The team's batches, newest first (at most 100 a page)."),
            "post": _operation("Create batch", BatchObjectSerializer, request=views.BatchCreateSerializer,
                               description="Runs the input file's lines at the `batch` priority class."),
        },
        "BatchDetailView": {"get": _operation("Retrieve batch", BatchObjectSerializer, request=None)},
        "BatchCancelView": {
            "post": _operation("Cancel batch", BatchObjectSerializer, request=None,
                               description="`cancelling` now, `cancelled` once its running lines have stopped; "
                                           "409 for a batch already finished."),
        },
    }


def _view_extension(name: str) -> type:
    def view_replacement(self):
        # A subclass, as in openai_api/schema.py: extend_schema_view on the served class would turn
        # its async handlers sync.
        documented = type(self.target_class.__name__, (self.target_class,), {"__module__": __name__})
        return extend_schema_view(**_schemas()[name])(documented)

    return type(name + "Schema", (OpenApiViewExtension,),
                {"target_class": f"openai_api.batches.views.{name}", "view_replacement": view_replacement})


VIEW_EXTENSIONS = [_view_extension(name) for name in (
    "FilesView", "FileDetailView", "FileContentView", "BatchesView", "BatchDetailView", "BatchCancelView")]
