from asgiref.sync import sync_to_async
from django.contrib import admin
from django.urls import include, path
from django.views.decorators.csrf import csrf_exempt

from openai_api.tgi import TGIRootView
from webui.pages import home

tgi_root = TGIRootView.as_view()


@csrf_exempt
async def root(request):
    """`GET /` is the home page; `POST /` is TGI's generate (what huggingface_hub's text_generation posts)."""
    if request.method == "POST":
        return await tgi_root(request)
    return await sync_to_async(home)(request)

from drf_spectacular.views import SpectacularJSONAPIView, SpectacularRedocView, SpectacularSwaggerSplitView

# The API's own patterns first: every request is matched in order, and each include that fails
# builds its list of patterns tried.
urlpatterns = [
    path("", include("openai_api.urls")),
    path("admin/", admin.site.urls),
    path("openapi.json", SpectacularJSONAPIView.as_view(), name="openapi"),
    path("docs", SpectacularSwaggerSplitView.as_view(url_name="openapi"), name="docs"),
    path("docs/redoc", SpectacularRedocView.as_view(url_name="openapi"), name="redoc"),
    path("", root),
    path("", include("teams.urls")),
    path("", include("webui.urls")),
]

handler400 = "openai_api.errors.bad_request_view"
handler403 = "openai_api.errors.forbidden_view"
handler404 = "openai_api.errors.not_found_view"
handler500 = "openai_api.errors.server_error_view"
