"""`/v1/files` and `/v1/batches`: thin views over files.py and service.py, in OpenAI's shapes.

Every read goes through the caller's team: another team's file or batch is a 404. Any call starts
this process's batch runner if it is not running (a process started without `serve` runs batches too).
"""
from __future__ import annotations

from channels.db import database_sync_to_async
from django.conf import settings
from django.http import FileResponse
from rest_framework import serializers
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.response import Response

from ..base import OpenAIView
from ..errors import APIError
from . import files, service
from .runner import start_runner


def db(function):
    return database_sync_to_async(function, thread_sensitive=False)


class PageSerializer(serializers.Serializer):
    after = serializers.CharField(required=False, max_length=100)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=10000, default=20)


class FileListSerializer(PageSerializer):
    purpose = serializers.CharField(required=False, max_length=40)
    order = serializers.ChoiceField(choices=("asc", "desc"), required=False, default="desc")


class BatchCreateSerializer(serializers.Serializer):
    input_file_id = serializers.CharField(max_length=100, help_text="a file uploaded with `purpose: batch`")
    endpoint = serializers.CharField(max_length=100, help_text="`/v1/completions`, `/v1/chat/completions`, "
                                                               "`/v1/responses` or `/v1/embeddings`: every line's `url`")
    completion_window = serializers.CharField(max_length=10, help_text="`24h`")
    metadata = serializers.DictField(child=serializers.CharField(max_length=512, allow_blank=True), required=False,
                                     allow_null=True, allow_empty=True,
                                     help_text="at most 16 pairs, keys of at most 64 characters")

    def validate_metadata(self, value):
        if value is not None and len(value) > 16:
            raise serializers.ValidationError("metadata may have at most 16 keys.")
        if value and any(len(key) > 64 or "\x00" in key for key in value):
            raise serializers.ValidationError("metadata keys are strings of at most 64 characters.")
        return value


class BatchAPIView(OpenAIView):
    # Described in /openapi.json by schema.py (the objects, the multipart upload, the binary content).
    initial_on_loop = False  # its initial starts the batch runner

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        start_runner()

    def team_id(self) -> int:
        return self.request.auth.team.pk


class FilesView(BatchAPIView):
    parser_classes = [MultiPartParser, FormParser]
    buffers_body = False  # the upload is streamed to disk, bounded by INFERENCE_BATCH_FILE_MAX_BYTES

    def body_limit(self, request) -> int:
        return settings.INFERENCE.batches.file_max_bytes + 64 * 1024 if request.method == "POST" else super().body_limit(request)

    async def get(self, request):
        query = FileListSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        options = query.validated_data
        page, more = await db(files.list_files)(self.team_id(), options.get("purpose"), options["limit"],
                                                options.get("after"), options["order"])
        return Response(files.list_body([files.file_object(f) for f in page], more))

    async def post(self, request):
        upload = request.FILES.get("file")
        if upload is None:
            raise APIError(400, "Missing file: send it as the multipart field 'file'.", param="file",
                           code="missing_required_parameter")
        purpose = request.data.get("purpose")
        if not purpose:
            raise APIError(400, "Missing purpose.", param="purpose", code="missing_required_parameter")
        stored = await db(files.save_upload)(self.team_id(), str(purpose), upload)
        return Response(files.file_object(stored))


class FileDetailView(BatchAPIView):
    async def get(self, request, file_id: str):
        return Response(files.file_object(await db(files.get_file)(self.team_id(), file_id)))

    async def delete(self, request, file_id: str):
        await db(files.delete_file)(self.team_id(), file_id)
        return Response({"id": file_id, "object": "file", "deleted": True})


class FileContentView(BatchAPIView):
    def perform_content_negotiation(self, request, force=False):
        """The SDK asks for `application/binary`; errors still answer in JSON, the file as it is."""
        return super().perform_content_negotiation(request, force=True)

    async def get(self, request, file_id: str):
        stored = await db(files.get_file)(self.team_id(), file_id)
        try:
            handle = open(files.path_of(stored), "rb")
        except OSError:
            raise files.file_not_found(file_id) from None
        return FileResponse(handle, content_type="application/jsonl", filename=stored.filename)


class BatchesView(BatchAPIView):
    async def get(self, request):
        query = PageSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        page, more = await db(service.list_batches)(self.team_id(), min(query.validated_data["limit"], 100),
                                                    query.validated_data.get("after"))
        return Response(files.list_body([service.batch_object(b) for b in page], more))

    async def post(self, request):
        body = BatchCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        batch = await db(service.create_batch)(request.auth, data["input_file_id"], data["endpoint"],
                                               data["completion_window"], data.get("metadata"))
        await start_runner().submit(batch.pk)
        return Response(service.batch_object(batch))


class BatchDetailView(BatchAPIView):
    async def get(self, request, batch_id: str):
        return Response(service.batch_object(await db(service.get_batch)(self.team_id(), batch_id)))


class BatchCancelView(BatchAPIView):
    async def post(self, request, batch_id: str):
        batch = await db(service.cancel_batch)(self.team_id(), batch_id)
        start_runner().wake.set()
        return Response(service.batch_object(batch))
