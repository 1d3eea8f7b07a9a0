"""The test OpenID provider (provider.js: npm's oidc-provider, installed by `npm ci --prefix tests/oidc`,
which `make test` runs) and a user agent for it: requests with cookies, following redirects and
filling its forms, until the provider sends the user back to gpusweep."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import requests

from conftest import need

HERE = Path(__file__).resolve().parent
INSTALLED = HERE / "node_modules" / "oidc-provider" / "package.json"
CLIENT_ID = "gpusweep-test"
CLIENT_SECRET = "test-secret-0f5c2a9e"  # the test provider's own client, nothing real
ROLE_MAP = {"sec-viewers": ["viewer"], "sre": ["operator"], "sec-approvers": ["approver"],
            "gpusweep-admins": ["admin"]}


@dataclass
class Provider:
    issuer: str
    users_file: Path
    log: Path

    def users(self) -> dict[str, dict[str, Any]]:
        loaded: dict[str, dict[str, Any]] = json.loads(self.users_file.read_text())
        return loaded

    def set_user(self, username: str, **fields: Any) -> None:
        """Change a user at the provider (read again at its next request)."""
        users = self.users()
        users.setdefault(username, {}).update(fields)
        self.users_file.write_text(json.dumps(users))

    def settings(self, **more: Any) -> dict[str, Any]:
        """gpusweep's settings for this provider (what the GPUSWEEP_OIDC_* variables set)."""
        return {"GPUSWEEP_OIDC_ISSUER": self.issuer, "GPUSWEEP_OIDC_PROVIDER_NAME": "Test IdP",
                "OIDC_RP_CLIENT_ID": CLIENT_ID, "OIDC_RP_CLIENT_SECRET": CLIENT_SECRET,
                "OIDC_RP_SCOPES": "openid email profile groups", "GPUSWEEP_OIDC_ROLE_MAP": ROLE_MAP,
                "AUTHENTICATION_BACKENDS": ["django.contrib.auth.backends.ModelBackend", "accounts.oidc.OidcBackend"],
                **more}


@contextmanager
def running(folder: Path, users: dict[str, dict[str, Any]], rp_origins: list[str]) -> Iterator[Provider]:
    """The provider on a free port of 127.0.0.1, its client redirecting to each of `rp_origins`."""
    node = shutil.which("node")
    need(node is not None, "install Node.js 20 and npm for the single sign-on tests")
    need(INSTALLED.exists(), "run `npm ci --prefix tests/oidc` (make test does) for the single sign-on tests")
    users_file, config, log = folder / "idp-users.json", folder / "idp-config.json", folder / "idp.log"
    users_file.write_text(json.dumps(users))
    config.write_text(json.dumps({"users_file": str(users_file), "client": {
        "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET,
        "redirect_uris": [f"{origin}/accounts/oidc/callback/" for origin in rp_origins],
        "post_logout_redirect_uris": [f"{origin}/accounts/login/" for origin in rp_origins]}}))
    with log.open("w") as errors:
        process = subprocess.Popen([str(node), str(HERE / "provider.js"), str(config)], stdout=subprocess.PIPE,
                                   stderr=errors, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # {"issuer": ...} once it listens
        assert line, f"the test provider did not start: {log.read_text()}"
        yield Provider(json.loads(line)["issuer"], users_file, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class Form:
    action: str
    method: str
    fields: dict[str, str] = field(default_factory=dict)


class _Forms(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.forms: list[Form] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "form":
            self.forms.append(Form(found.get("action") or "", (found.get("method") or "get").lower()))
        elif tag == "input" and self.forms and found.get("name"):
            self.forms[-1].fields[str(found["name"])] = found.get("value") or ""


def forms(html: str) -> list[Form]:
    parser = _Forms()
    parser.feed(html)
    return parser.forms


class Browser:
    """A user agent at the provider: follows its redirects and fills its forms (`fill` names the
    values of each form it meets) until a redirect leaves for `home` (gpusweep), whose URL it returns."""

    def __init__(self, home: str) -> None:
        self.home = home
        self.session = requests.Session()
        self.pages: list[str] = []  # the provider's pages seen in the last walk

    def walk(self, url: str, fill: Callable[[Form], dict[str, str]] | None = None, steps: int = 12) -> str:
        self.pages = []
        response = self.session.get(url, allow_redirects=False, timeout=10)
        for _ in range(steps):
            if response.is_redirect:
                url = urljoin(response.url, response.headers["Location"])
                if url.startswith(self.home):
                    return url
                response = self.session.get(url, allow_redirects=False, timeout=10)
                continue
            assert response.status_code == 200, f"{response.status_code} at {response.url}: {response.text[:500]}"
            self.pages.append(response.text)
            found = forms(response.text)
            assert found and fill is not None, f"a page with no form to fill at {response.url}: {response.text[:500]}"
            form = found[0]
            data = {**form.fields, **fill(form)}
            target = urljoin(response.url, form.action or response.url)
            response = self.session.request(form.method.upper(), target, data=data, allow_redirects=False, timeout=10)
        raise AssertionError(f"still at the provider after {steps} steps: {response.url}")


def password(username: str, secret: str) -> Callable[[Form], dict[str, str]]:
    """Fills the provider's login form."""
    def fill(form: Form) -> dict[str, str]:
        assert "password" in form.fields, f"expected the login form, got {form}"
        return {"username": username, "password": secret}
    return fill


def confirm_logout(form: Form) -> dict[str, str]:
    """Answers the provider's "Do you want to sign-out?" with yes."""
    assert "xsrf" in form.fields, f"expected the logout form, got {form}"
    return {"logout": "yes"}
