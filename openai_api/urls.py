from django.urls import path

from .completions import CompletionsView
from .health import health
from .model_list import ModelDetailView, ModelListView

urlpatterns = [
    path("health", health),
    path("v1/completions", CompletionsView.as_view()),
    path("v1/models", ModelListView.as_view()),
    path("v1/models/<path:model_id>", ModelDetailView.as_view()),
]
