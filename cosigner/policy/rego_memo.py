"""Remembered Rego results: when a bundle's value is a function of its input alone.

rego-cpp evaluates the same modules on the same input to the same output unless a
built-in reads something else: the clock (``time.now_ns``), randomness (``rand.intn``,
``uuid.rfc4122``, an ECDSA signature of ``io.jwt.encode_sign``), the network
(``http.send``, ``net.lookup_ip_addr``), the runtime (``opa.runtime``) or the clock again
through verification (``io.jwt.decode_verify``, certificate checks). Every such built-in
in OPA's catalogue and rego-cpp 1.5.2's has a dotted name, so :func:`is_pure` accepts
modules whose every dotted call is a built-in of :data:`PURE_BUILTINS` (listed, not
guessed: an unknown one, an imported alias ``lib.f(`` included, makes the modules
impure) or a function under ``data.``; undotted calls are the modules' own functions or
pure built-ins (``count``, ``sprintf``, …). The engine keeps no ``data`` document
besides the modules, so for pure modules the output is a function of the input members
they read.

:class:`ResultMemo` maps :func:`cosigner.core.fastjson.exact_key` bytes of those members
(exact JSON types, key order included: rego-cpp keeps an object's insertion order, e.g.
in ``object.keys``) to rego-cpp's output text. Bounded: at most :data:`MAX_ENTRIES`
entries and :data:`MAX_BYTES` bytes of keys and texts; when full it is cleared whole
(a cache of a few hot inputs, not a store). One per engine, i.e. per bundle revision.
"""

from __future__ import annotations

import re

#: Dotted built-ins whose value depends on their arguments only (rego-cpp 1.5.2 names).
PURE_BUILTINS = frozenset({
    "array.concat", "array.reverse", "array.slice",
    "base64.decode", "base64.encode", "base64.is_valid", "base64url.decode",
    "base64url.encode", "base64url.encode_no_pad",
    "bits.and", "bits.lsh", "bits.negate", "bits.or", "bits.rsh", "bits.xor",
    "crypto.md5", "crypto.sha1", "crypto.sha256", "crypto.hmac.md5", "crypto.hmac.sha1",
    "crypto.hmac.sha256", "crypto.hmac.sha512", "crypto.hmac.equal",
    "glob.match", "glob.quote_meta", "hex.decode", "hex.encode",
    "io.jwt.decode",
    "json.filter", "json.is_valid", "json.marshal", "json.marshal_with_options",
    "json.match_schema", "json.patch", "json.remove", "json.unmarshal", "json.verify_schema",
    "net.cidr_contains", "net.cidr_expand", "net.cidr_intersects", "net.cidr_is_valid",
    "net.cidr_merge", "net.cidr_overlap",
    "numbers.range", "numbers.range_step",
    "object.filter", "object.get", "object.keys", "object.remove", "object.subset",
    "object.union", "object.union_n",
    "regex.find_all_string_submatch_n", "regex.find_n", "regex.globs_match",
    "regex.is_valid", "regex.match", "regex.replace", "regex.split", "regex.template_match",
    "semver.compare", "semver.is_valid",
    "strings.any_prefix_match", "strings.any_suffix_match", "strings.count",
    "strings.replace_n", "strings.reverse",
    "time.add_date", "time.clock", "time.date", "time.diff", "time.format", "time.parse_ns",
    "time.parse_rfc3339_ns", "time.weekday",
    "units.parse", "units.parse_bytes",
    "urlquery.decode", "urlquery.decode_object", "urlquery.encode", "urlquery.encode_object",
    "yaml.is_valid", "yaml.marshal", "yaml.unmarshal",
})

#: A string, a raw string or a comment (Rego's lexical order: whichever starts first).
_NOISE = re.compile(r'"(?:[^"\\\n]|\\.)*"|`[^`]*`|#[^\n]*')
#: A call: a (dotted) name followed by ``(``, not itself the tail of a longer reference.
_CALL = re.compile(r"(?<![\w.\]])([A-Za-z_]\w*(?:\s*\.\s*[A-Za-z_]\w*)*)\s*\(")
#: What the call scan cannot see through, so the modules count as impure (rego-cpp 1.5.2
#: runs each): a template string (``$"{time.now_ns()}"``, code inside a string) and a
#: call of a bracketed reference (``time["now_ns"]()``).
_OPAQUE = re.compile(r'\$\s*["`]|\]\s*\(')

MAX_ENTRIES = 4096
MAX_BYTES = 8 << 20
#: A larger key is not remembered (it would crowd out the hot ones).
MAX_KEY_BYTES = 16 << 10


def is_pure(sources: dict[str, str]) -> bool:
    """Whether every dotted call in ``sources`` (Rego modules by name) is a function
    under ``data.`` or a built-in of :data:`PURE_BUILTINS` (strings and comments aside).
    Conservative: ``False`` may be said of pure modules, never ``True`` of impure ones."""
    for source in sources.values():
        # A comment is a space, not a token: ``time. # c`` NEWLINE ``now_ns()`` is a call.
        code = _NOISE.sub(_blank, source)
        if _OPAQUE.search(code):
            return False
        for match in _CALL.finditer(code):
            name = re.sub(r"\s+", "", match.group(1))
            if "." in name and not name.startswith("data.") and name not in PURE_BUILTINS:
                return False
    return True


def without_comments(source: str) -> str:
    """``source`` with each comment a space; strings and raw strings (a ``#`` in one is
    no comment) kept as they are."""
    return _NOISE.sub(_comment_out, source)


def _comment_out(noise: re.Match[str]) -> str:
    text = noise.group()
    return " " if text.startswith("#") else text


def _blank(noise: re.Match[str]) -> str:
    """A string as an empty one; a comment as a space."""
    return " " if noise.group().startswith("#") else '""'


class ResultMemo:
    """Output texts of one engine by input key (see the module docstring)."""

    def __init__(self) -> None:
        self._texts: dict[bytes, str] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._texts)

    def get(self, key: bytes) -> str | None:
        """The output text remembered for ``key``, or ``None``."""
        return self._texts.get(key)

    def put(self, key: bytes, text: str) -> None:
        """Remember ``text`` for ``key`` (nothing when the key is larger than
        :data:`MAX_KEY_BYTES`; everything forgotten first when a bound would be passed)."""
        if len(key) > MAX_KEY_BYTES or key in self._texts:
            return
        size = len(key) + len(text)
        if len(self._texts) >= MAX_ENTRIES or self._bytes + size > MAX_BYTES:
            self._texts.clear()
            self._bytes = 0
        self._texts[key] = text
        self._bytes += size
