"""REST API under /api/v1/accounts/: obtain a token with a password, list and revoke your own.

``POST token/`` takes ``username``, ``password``, a ``name`` and an optional ``expires_at`` and
answers the key once. ``tokens/`` lists, makes (the key once) and revokes (DELETE) the caller's
own tokens only: anyone logged in manages their own, nobody sees another's.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import authenticate
from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import api_view, authentication_classes, permission_classes, throttle_classes
from rest_framework.exceptions import AuthenticationFailed, ValidationError
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import AnonRateThrottle

from accounts import services
from accounts.authentication import ApiTokenAuthentication
from accounts.models import ApiToken
from gpusweep.routers import ApiRouter
from gpusweep.schema import ERROR


class ApiTokenSerializer(serializers.ModelSerializer):
    active = serializers.SerializerMethodField()

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "last_used_at", "expires_at", "revoked_at", "active"]
        read_only_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]

    def get_active(self, obj: ApiToken) -> bool:
        from django.utils import timezone

        return obj.revoked_at is None and (obj.expires_at is None or obj.expires_at > timezone.now())


class IssuedApiTokenSerializer(ApiTokenSerializer):
    key = serializers.CharField(read_only=True, help_text="shown once: store it now")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "key"]


class ObtainTokenSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=256, style={"input_type": "password"})
    name = serializers.CharField(max_length=100, required=False, default="api")
    expires_at = serializers.DateTimeField(required=False, allow_null=True)


def _issued(token: ApiToken, key: str) -> dict[str, Any]:
    data: dict[str, Any] = dict(IssuedApiTokenSerializer(token).data)
    data["key"] = key
    return data


def _issue(user: Any, name: str, expires_at: Any) -> Response:
    try:
        token, key = services.issue(user, name, expires_at)
    except services.TokenError as exc:
        field, _, message = str(exc).partition(": ")
        raise ValidationError({field: [message]} if message else {"detail": str(exc)}) from None
    return Response(_issued(token, key), status=status.HTTP_201_CREATED)


class ObtainThrottle(AnonRateThrottle):
    rate = "30/min"  # password guessing stays slow


@extend_schema(request=ObtainTokenSerializer, responses={
    201: IssuedApiTokenSerializer, 429: OpenApiResponse(response=ERROR, description="Too Many Requests")})
@api_view(["POST"])
# No session (so no CSRF check on a login by password); a 401 carries the Bearer challenge.
@authentication_classes([ApiTokenAuthentication])
@permission_classes([AllowAny])
@throttle_classes([ObtainThrottle])
def obtain_token(request: Request) -> Response:
    """A new named token for the user whose username and password are given (the key, once)."""
    body = ObtainTokenSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    user = authenticate(request._request, username=body.validated_data["username"],
                        password=body.validated_data["password"])
    if user is None:
        raise AuthenticationFailed("wrong username or password")
    return _issue(user, body.validated_data["name"], body.validated_data.get("expires_at"))


class TokenViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                   mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """The caller's own tokens. DELETE revokes (the row stays, with when it was revoked)."""

    serializer_class = ApiTokenSerializer
    permission_classes = [IsAuthenticated]
    ordering_fields = ["created_at", "last_used_at", "name"]

    def get_queryset(self) -> QuerySet[ApiToken]:
        if not self.request.user.is_authenticated:  # the schema generator
            return ApiToken.objects.none()
        return ApiToken.objects.filter(user=self.request.user)

    @extend_schema(responses={201: IssuedApiTokenSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        body = self.get_serializer(data=request.data)
        body.is_valid(raise_exception=True)
        return _issue(request.user, body.validated_data["name"], body.validated_data.get("expires_at"))

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        token = self.get_object()
        services.revoke(request.user, token.pk)  # type: ignore[arg-type]
        return Response(status=status.HTTP_204_NO_CONTENT)


class AccountsRouter(ApiRouter):
    def get_urls(self) -> list[Any]:
        from django.urls import path

        return [path("token/", obtain_token, name="token-obtain"), *super().get_urls()]


router = AccountsRouter()
router.register("tokens", TokenViewSet, basename="token")
