from django.urls import path

from .audio import TranscriptionsView, TranslationsView
from .batches.views import (BatchCancelView, BatchDetailView, BatchesView, FileContentView, FileDetailView,
                            FilesView)
from .chat import ChatCompletionsView
from .completions import CompletionsView
from .embeddings import EmbeddingsView
from .health import health, live
from .metrics import MetricsView
from .model_list import ModelDetailView, ModelListView
from .model_loading import LoadModelView, UnloadModelView
from .score import RerankAliasView, RerankV2View, RerankView, ScoreAliasView, ScoreView
from .response_views import CancelResponseView, InputItemsView, ResponsesView, StoredResponseView
from .server_info import TokenizerInfoView, VersionView
from .tgi import TGIGenerateView, TGIInfoView, TGIStreamView
from .tokenization import DetokenizeV1View, DetokenizeView, TokenizeV1View, TokenizeView

urlpatterns = [
    path("health", health),
    path("metrics", MetricsView.as_view()),
    path("health/live", live),
    path("version", VersionView.as_view()),
    path("tokenizer_info", TokenizerInfoView.as_view()),
    path("tokenize", TokenizeView.as_view()),
    path("detokenize", DetokenizeView.as_view()),
    path("v1/tokenize", TokenizeV1View.as_view()),  # forgather's (and some clients') place for the same
    path("v1/detokenize", DetokenizeV1View.as_view()),
    path("v1/completions", CompletionsView.as_view()),
    path("v1/chat/completions", ChatCompletionsView.as_view()),
    path("v1/embeddings", EmbeddingsView.as_view()),
    path("v1/rerank", RerankView.as_view()),
    path("rerank", RerankAliasView.as_view()),
    path("v2/rerank", RerankV2View.as_view()),
    path("v1/score", ScoreView.as_view()),
    path("score", ScoreAliasView.as_view()),
    path("v1/responses", ResponsesView.as_view()),
    path("v1/responses/<str:response_id>", StoredResponseView.as_view()),
    path("v1/responses/<str:response_id>/input_items", InputItemsView.as_view()),
    path("v1/responses/<str:response_id>/cancel", CancelResponseView.as_view()),
    path("v1/audio/transcriptions", TranscriptionsView.as_view()),
    path("v1/audio/translations", TranslationsView.as_view()),
    path("v1/files", FilesView.as_view()),
    path("v1/files/<str:file_id>", FileDetailView.as_view()),
    path("v1/files/<str:file_id>/content", FileContentView.as_view()),
    path("v1/batches", BatchesView.as_view()),
    path("v1/batches/<str:batch_id>", BatchDetailView.as_view()),
    path("v1/batches/<str:batch_id>/cancel", BatchCancelView.as_view()),
    path("load_model", LoadModelView.as_view()),
    path("unload_model", UnloadModelView.as_view()),
    path("v1/models", ModelListView.as_view()),
    path("v1/models/<path:model_id>", ModelDetailView.as_view()),
    path("generate", TGIGenerateView.as_view()),
    path("generate_stream", TGIStreamView.as_view()),
    path("info", TGIInfoView.as_view()),
]
