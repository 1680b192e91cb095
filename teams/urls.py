from django.urls import path

from .views import KeyStatusView

urlpatterns = [path("v1/key", KeyStatusView.as_view())]
