from django.urls import path

from . import account, conversations, pages

urlpatterns = [
    path("", pages.home),
    path("favicon.ico", pages.favicon),
    path("login", pages.login, name="login"),
    path("logout", pages.logout, name="logout"),
    path("chat", pages.chat, name="chat"),
    path("playground", pages.playground, name="playground"),
    path("account", pages.account, name="account"),
    path("ui/api/conversations", conversations.ConversationListView.as_view()),
    path("ui/api/conversations/<int:conversation_id>", conversations.ConversationDetailView.as_view()),
    path("ui/api/conversations/<int:conversation_id>/turns", conversations.TurnsView.as_view()),
    path("ui/api/usage", account.UsageView.as_view()),
    path("ui/api/keys", account.KeyListView.as_view()),
    path("ui/api/keys/<int:key_id>", account.KeyDetailView.as_view()),
]
