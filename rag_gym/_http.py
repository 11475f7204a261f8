"""Redirects for rag-gym's HTTP clients (the retrieval server's, the OpenAI-compatible
backend's): credentials stay with the origin they were given for."""

from __future__ import annotations

import urllib.parse
import urllib.request

#: the schemes an HTTP client follows, with their default ports
DEFAULT_PORTS = {"http": 80, "https": 443}


def origin(url: str) -> tuple[str, str, int | None]:
    """A URL's scheme, host and port (the scheme's default port when it names none; ``None``
    for a port that is not a number, an origin of its own).

    >>> origin("HTTP://LocalHost/v1") == origin("http://localhost:80/x")
    True
    >>> origin("http://127.0.0.1:8000") == origin("http://localhost:8000")
    False
    """
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port or DEFAULT_PORTS.get(scheme)


class SameOriginCredentials(urllib.request.HTTPRedirectHandler):
    """Follows redirects as urllib does, but drops the ``Authorization`` header when a redirect
    leads to another origin (scheme, host or port): a token or key is for the server it was
    given for, never for wherever that server points."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        return self.keep_credentials(req, new, newurl)

    @staticmethod
    def keep_credentials(req, new, newurl: str):
        """``new`` (the redirected request, or ``None``) without ``Authorization`` unless
        ``newurl`` has ``req``'s origin."""
        if new is not None and origin(newurl) != origin(req.full_url):
            new.remove_header("Authorization")
        return new
