"""The one HTTP client every advisory source uses: timeouts, a size limit, a user agent, and
conditional requests (ETag / Last-Modified) so an unchanged document costs one 304."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from django.conf import settings

from advisories.csaf import DocumentError

USER_AGENT = "gpusweep-advisories/0.1 (+https://github.com/gpusweep)"


@dataclass
class Response:
    url: str
    status: int  # 200, or 304 when the validators still hold
    body: bytes
    content_type: str
    etag: str
    last_modified: str

    @property
    def not_modified(self) -> bool:
        return self.status == 304

    def validators(self) -> dict[str, str]:
        return {"url": self.url, "etag": self.etag, "last_modified": self.last_modified}


class HttpClient:
    def __init__(self, timeout: float | None = None, max_bytes: int | None = None,
                 user_agent: str = USER_AGENT) -> None:
        self.timeout = timeout if timeout is not None else settings.GPUSWEEP_ADVISORY_HTTP_TIMEOUT
        self.max_bytes = max_bytes if max_bytes is not None else settings.GPUSWEEP_ADVISORY_MAX_BYTES
        self.user_agent = user_agent

    def get(self, url: str, etag: str = "", last_modified: str = "", missing_ok: bool = False) -> Response | None:
        """GET `url`. Conditional when validators are given. None on 404 with `missing_ok`.

        Raises DocumentError naming the URL on anything else: HTTP errors, timeouts, a body over
        the size limit, a server that trickles bytes past the overall deadline.
        """
        headers = {"User-Agent": self.user_agent, "Accept": "application/json, application/atom+xml, */*"}
        if etag:
            headers["If-None-Match"] = etag
        if last_modified:
            headers["If-Modified-Since"] = last_modified
        request = urllib.request.Request(url, headers=headers)
        deadline = time.monotonic() + self.timeout * 3
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                length = response.headers.get("Content-Length")
                if length and length.isdigit() and int(length) > self.max_bytes:
                    raise DocumentError(url, f"response is {int(length)} bytes, over the {self.max_bytes} byte limit")
                chunks: list[bytes] = []
                size = 0
                while True:
                    chunk = response.read(65536)
                    if not chunk:
                        break
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise DocumentError(url, f"response exceeds the {self.max_bytes} byte limit")
                    if time.monotonic() > deadline:
                        raise DocumentError(url, f"response took longer than {self.timeout * 3:.0f} s")
                    chunks.append(chunk)
                return Response(
                    url=url, status=response.status, body=b"".join(chunks),
                    content_type=response.headers.get("Content-Type", ""),
                    etag=response.headers.get("ETag", ""), last_modified=response.headers.get("Last-Modified", ""),
                )
        except urllib.error.HTTPError as exc:
            if exc.code == 304:
                return Response(url, 304, b"", "", etag, last_modified)
            if exc.code == 404 and missing_ok:
                return None
            raise DocumentError(url, f"HTTP {exc.code} {exc.reason}") from None
        except urllib.error.URLError as exc:
            raise DocumentError(url, f"cannot fetch: {exc.reason}") from None
        except TimeoutError:
            raise DocumentError(url, f"no response within {self.timeout:g} s") from None
        except OSError as exc:
            raise DocumentError(url, f"cannot fetch: {exc}") from None
