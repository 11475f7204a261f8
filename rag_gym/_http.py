"""URLs for rag-gym's HTTP clients (the retrieval server's, the OpenAI-compatible backend's,
the search engines'): the one place that tells a URL from a path by its text, and redirects
that keep credentials with the origin they were given for."""

from __future__ import annotations

import urllib.parse
import urllib.request

#: the schemes an HTTP client follows, with their default ports
DEFAULT_PORTS = {"http": 80, "https": 443}


#: the search engines, by URL scheme prefix (``opensearch+http://...``)
FLAVORS = ("opensearch", "elasticsearch")


def is_server_url(value: object) -> bool:
    """Whether ``value`` is an ``http(s)://`` URL (a retrieval server's, a backend's)."""
    return isinstance(value, str) and value.startswith(("http://", "https://"))


def is_engine_url(value: object) -> bool:
    """Whether ``value`` names an index on a cluster (``opensearch+http://...``,
    ``elasticsearch+https://...``), as ``index=`` and ``rag-gym serve --index`` take it.

    >>> is_engine_url("opensearch+http://127.0.0.1:9200/wiki18"), is_engine_url("indexes/bm25")
    (True, False)
    """
    return isinstance(value, str) and value.startswith(
        tuple(f"{f}+{s}://" for f in FLAVORS for s in ("http", "https"))
    )


def is_url(value: object) -> bool:
    """Whether ``value`` is a URL of any scheme (not a path on this machine)."""
    return isinstance(value, str) and "://" in value


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
