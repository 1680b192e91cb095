from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularJSONAPIView, SpectacularRedocView, SpectacularSwaggerSplitView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("openapi.json", SpectacularJSONAPIView.as_view(), name="openapi"),
    path("docs", SpectacularSwaggerSplitView.as_view(url_name="openapi"), name="docs"),
    path("docs/redoc", SpectacularRedocView.as_view(url_name="openapi"), name="redoc"),
    path("", include("teams.urls")),
    path("", include("webui.urls")),
    path("", include("openai_api.urls")),
]

handler400 = "openai_api.errors.bad_request_view"
handler403 = "openai_api.errors.forbidden_view"
handler404 = "openai_api.errors.not_found_view"
handler500 = "openai_api.errors.server_error_view"
