"""The one place that decides what a secret looks like and hides it: config reprs, notes, the UI, errors.

Everything the project shows a person -- a config's ``repr``, a run's note, an
error line recorded for the CDC view, a Spark error brought back to the
Airflow task, a message on the page -- goes through :func:`redact` (text) or
:func:`redact_value` (a nested config document) first. The rules:

* **known values**: every secret the caller knows (the config's values under
  secret-looking keys, passwords inside its URLs, credentials an Airflow
  connection supplied) is replaced wherever it appears, longest first;
* **URLs**: the user-info of any ``scheme://user:password@host`` is masked
  after the user name (all of it when there is no user name), whatever
  characters the password holds -- the last ``@`` of the URL ends it;
* **assignments**: ``key=value``, ``key: value`` and ``"key": "value"`` where the
  key looks secret (``secret``, ``password``, ``token``, ``credential``,
  ``session``, ``api_key``, ``private_key``, ...), including URL parameters
  (``;token=``, ``?X-Amz-Signature=``, ``&password=``);
* **shapes**: AWS access key ids (``AKIA``/``ASIA`` + 16), ``Bearer``/``Basic``
  authorization values, JSON web tokens, PEM private key blocks.

It **fails closed**: if anything goes wrong while checking a text (an
unexpected type, a bug), the text is withheld (:data:`WITHHELD`), never
returned as it was; a config value of a type it does not know is masked.
No Airflow import: Airflow's own secrets masker is private API, and what it
would know (connection passwords) the callers hand over as known values.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "***"
WITHHELD = "*** (text withheld: it could not be checked for secrets)"
MIN_SECRET_LENGTH = 4  # shorter known values would mask ordinary words and digits

_SECRET_HINTS = (
    "secret",
    "password",
    "passwd",
    "pwd",
    "token",
    "credential",
    "session",
    "api_key",
    "api-key",
    "apikey",
    "private_key",
    "private-key",
    "signature",
    "authorization",
)
# Keys that contain a hint but name no secret: their values are kept.
_NOT_SECRET_KEYS = frozenset({"session_id", "session-id"})

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
_HINT = "|".join(re.escape(hint) for hint in _SECRET_HINTS)
# Only names holding a hint are matched, so an ordinary ``key: value`` never hides a secret after it.
_ASSIGNMENT = re.compile(
    rf"""(?P<key>["']?(?P<name>[\w.\-]*(?:{_HINT})[\w.\-]*)["']?)(?P<sep>\s*(?:=|:)\s*)"""
    r"""(?P<value>"[^"]*"|'[^']*'|[^\s,;&)}\]"']+)""",
    re.IGNORECASE,
)
_AWS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")
_AUTH_HEADER = re.compile(r"\b(Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE)
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*")
_PEM = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|$)", re.DOTALL)


def is_secret_key(key: str) -> bool:
    """Whether a config key, URL parameter or assignment name holds a secret (by its name)."""
    lowered = str(key).strip("\"' ").lower()
    if lowered in _NOT_SECRET_KEYS or lowered.rsplit(".", 1)[-1] in _NOT_SECRET_KEYS:
        return False
    return any(hint in lowered for hint in _SECRET_HINTS)


def _userinfo(url: str) -> tuple[str, str, str] | None:
    """``(scheme://, user-info, @host...)`` of a URL with user-info, else None.

    The user-info ends at the last ``@`` before the path, so a password holding
    ``/``, ``:`` or ``@`` is still all inside it.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    last_at = rest.rfind("@")
    if last_at < 0:
        return None
    end = len(rest)
    for stop in "/?#;":
        found = rest.find(stop, last_at + 1)
        if found >= 0:
            end = min(end, found)
    at = rest.rfind("@", 0, end)
    if at < 0:
        return None
    return scheme + sep, rest[:at], rest[at:]


def _mask_url(match: re.Match[str]) -> str:
    url = match.group(0)
    parts = _userinfo(url)
    if parts is None:
        return url
    head, userinfo, host = parts
    user, colon, _ = userinfo.partition(":")
    masked = f"{user}:{MASK}" if colon and user and "/" not in user else MASK
    return f"{head}{masked}{host}"


def _mask_assignment(match: re.Match[str]) -> str:
    if not is_secret_key(match.group("name")):
        return match.group(0)
    value = match.group("value")
    quote = value[0] if value[:1] in ("'", '"') else ""
    return f"{match.group('key')}{match.group('sep')}{quote}{MASK}{quote}"


def _known(secrets: Iterable[Any]) -> list[str]:
    values = {str(s) for s in secrets if s is not None and len(str(s)) >= MIN_SECRET_LENGTH}
    return sorted(values, key=len, reverse=True)


def redact(text: Any, secrets: Iterable[Any] = ()) -> str:
    """``text`` with every secret it holds replaced by ``***``; :data:`WITHHELD` if it cannot be checked."""
    try:
        result = text if isinstance(text, str) else str(text)
        for secret in _known(secrets):
            result = result.replace(secret, MASK)
        result = _PEM.sub(MASK, result)
        # Assignments before URLs: a URL parameter's value may hold an ``@`` (``;password=@x``), which
        # the URL rule would otherwise take for the end of a user-info and leave the value behind it.
        result = _AUTH_HEADER.sub(lambda m: f"{m.group(1)} {MASK}", result)
        result = _ASSIGNMENT.sub(_mask_assignment, result)
        result = _URL.sub(_mask_url, result)
        result = _JWT.sub(MASK, result)
        return _AWS_KEY_ID.sub(MASK, result)
    except Exception:  # fail closed: a text that could not be checked is never shown
        return WITHHELD


def redact_value(value: Any, key: str = "", secrets: Iterable[Any] = ()) -> Any:
    """A nested document (a config dump) with secrets masked: values of secret keys, secrets in strings.

    Plain values (numbers, booleans, None) are kept; a value of any other type
    is masked, since it cannot be checked.
    """
    known = _known(secrets)
    return _walk(value, key, known)


def _walk(value: Any, key: str, known: list[str]) -> Any:
    if isinstance(value, Mapping):
        return {k: _walk(v, str(k), known) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_walk(v, key, known) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return MASK if value is not None and key and is_secret_key(key) else value
    if isinstance(value, str):
        return MASK if key and is_secret_key(key) else redact(value, known)
    return MASK


def secret_values(document: Any, key: str = "") -> set[str]:
    """The secret values of a nested document: values of secret keys, and passwords inside URLs."""
    found: set[str] = set()

    def walk(value: Any, name: str) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(v, str(k))
        elif isinstance(value, list | tuple):
            for v in value:
                walk(v, name)
        elif isinstance(value, str):
            if name and is_secret_key(name):
                found.add(value)
            for url in _URL.findall(value):
                parts = _userinfo(url)
                if parts is not None:
                    user, colon, password = parts[1].partition(":")
                    found.add(password if colon and user else parts[1])

    walk(document, key)
    return {value for value in found if value}


class Redactor:
    """:func:`redact` with a fixed set of known secrets (a config's, a connection's): ``Redactor(s)(text)``."""

    def __init__(self, secrets: Iterable[Any] = ()) -> None:
        self._secrets = _known(secrets)

    def __call__(self, text: Any) -> str:
        return redact(text, self._secrets)

    @property
    def known(self) -> int:
        """How many known values it hides (for tests and logs; never the values)."""
        return len(self._secrets)
