"""Idempotency keys and owner ids: the server's key rule (16 to 255 bytes of
``A-Z a-z 0-9 _ . : -``, contract §1.1) and a random generator that always satisfies it."""

from __future__ import annotations

import re
import secrets

MIN_LEN = 16
MAX_LEN = 255
_KEY_CHAR = re.compile(r"[A-Za-z0-9_.:\-]")


class KeyRuleError(ValueError):
    """A key breaks the key rule; the message says how."""


def validate(key: str) -> None:
    """Raises ``KeyRuleError`` when ``key`` breaks the server's key rule."""
    rule = "keys are 16 to 255 bytes of A-Z a-z 0-9 _ . : -"
    n = len(key.encode("utf-8"))
    if n < MIN_LEN or n > MAX_LEN:
        raise KeyRuleError("the key is %d bytes long; %s" % (n, rule))
    for i, c in enumerate(key):
        if not _KEY_CHAR.fullmatch(c):
            raise KeyRuleError("the key has %r at byte %d; %s" % (c, len(key[:i].encode("utf-8")), rule))


def random(prefix: str = "") -> str:
    """A fresh random key (or owner id): ``prefix`` and 128 random bits in hex. Generate one
    per logical operation and reuse it on every retry of that operation."""
    return prefix + secrets.token_hex(16)

