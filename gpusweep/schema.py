"""The OpenAPI schema's share of the error format: every operation documents the errors it can answer.

Every operation can answer 400 (a bad query, a NUL in the path), 401, 403 and 404 (no such
object, or ``?format=`` naming no renderer); one taking a body also 409 (the object's state
forbids it), 413 (over the upload limit) and 415 (a media type no parser reads); a DELETE also
409 (the object is still referenced). All of them in ``gpusweep.errors``' format.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.utils import OpenApiResponse, inline_serializer
from rest_framework import serializers

ALWAYS = (400, 401, 403, 404)
WITH_BODY = (409, 413, 415)


# The API's error: a sentence, and per field what is wrong with it (400 only). Built inline since
# a serializer class cannot declare a field named "errors" (Serializer.errors).
ERROR = inline_serializer("Error", {
    "detail": serializers.CharField(),
    "errors": serializers.DictField(child=serializers.ListField(child=serializers.CharField()), required=False),
})


class AutoSchema(SpectacularAutoSchema):
    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        responses: dict[str, Any] = super()._get_response_bodies(direction)
        codes = ALWAYS + (WITH_BODY if self.method in ("POST", "PUT", "PATCH") else ())
        if self.method == "DELETE":
            codes += (409,)  # still referenced (a protected foreign key)
        for code in codes:
            if str(code) not in responses:
                described = OpenApiResponse(response=ERROR, description=HTTPStatus(code).phrase)
                responses[str(code)] = self._get_response_for_code(described, str(code), direction=direction)
        return responses
