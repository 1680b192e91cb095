from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("openai_api.urls")),
]

handler404 = "openai_api.errors.not_found_view"
handler500 = "openai_api.errors.server_error_view"
