"""/accounts/: login, logout and single sign-on, before Django's own (password change ...)."""

from django.urls import path

from accounts import login, oidc

urlpatterns = [
    path("login/", login.LoginView.as_view(), name="login"),
    path("logout/", login.LogoutView.as_view(), name="logout"),
    path("oidc/authenticate/", oidc.AuthenticateView.as_view(), name="oidc-authenticate"),
    path("oidc/callback/", oidc.CallbackView.as_view(), name="oidc-callback"),
]
